//! The README's "Use the real datasets" walkthrough as commands: the `./just …` lines of the first
//! `sh` block under that heading, split into words as a shell would (quotes, `\"`, comments) with
//! `$DATASETS` replaced by a test's folder. `./just datasets ARGS` is the `datasets` binary with
//! ARGS; `./just repro ID ARGS` the experiment binary ID with ARGS.

/// One line of the walkthrough.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Datasets(Vec<String>),
    Repro { id: String, args: Vec<String> },
}

/// The walkthrough's commands, from `readme` (the README's text), in order.
pub fn commands(readme: &str, datasets_dir: &str) -> Vec<Command> {
    let section = readme
        .split("\n## Use the real datasets\n")
        .nth(1)
        .expect("README has a section `## Use the real datasets`");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has an sh block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let words = shell_words(line, datasets_dir);
            match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["./just", "datasets", ..] => Command::Datasets(words[2..].to_vec()),
                ["./just", "repro", id, ..] => Command::Repro {
                    id: id.to_string(),
                    args: words[3..].to_vec(),
                },
                _ => panic!(
                    "the walkthrough line `{line}` is neither `./just datasets` nor `./just repro`"
                ),
            }
        })
        .collect()
}

/// `line` split as `sh` would: whitespace outside quotes, '…' literal, "…" with `\"` and
/// `$DATASETS` expanded, `#` outside quotes starting a comment.
pub fn shell_words(line: &str, datasets_dir: &str) -> Vec<String> {
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars>, word: &mut String| {
        let name: String =
            std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_'))
                .collect();
        assert_eq!(name, "DATASETS", "the walkthrough may use only $DATASETS");
        word.push_str(datasets_dir);
    };
    while let Some(c) = chars.next() {
        match c {
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        '$' => expand(&mut chars, &mut word),
                        c => word.push(c),
                    }
                }
            }
            '$' => {
                in_word = true;
                expand(&mut chars, &mut word);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}
