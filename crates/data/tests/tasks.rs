//! Task builders: exact resume from a saved state, T5 span-corruption statistics, BERT masking
//! proportions, seq2seq truncation.

mod common;

use common::*;
use data::Example;
use data::registry::{self, Split};
use data::source::{ExampleStream, SourceOptions, split_files};
use data::tasks::{
    BertMasking, NO_LOSS, PackState, Packer, PretrainObjective, Seq2SeqTask, SpanCorruption,
    random_copy_example, t5_span_lengths,
};
use data::tokenize::Tok;

/// A PG-19-layout directory with two shards of several row groups each.
fn books() -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    for shard in 0..2 {
        let texts: Vec<String> = (0..9)
            .map(|i| {
                format!("Book {shard}.{i}. ")
                    + &"It was the best of times, it was the worst of times. ".repeat(1 + i % 4)
            })
            .collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        write_parquet(
            &dir.path()
                .join(format!("data/train-0000{shard}-of-00002-abc.parquet")),
            vec![
                ("short_book_title", utf8(&["t"; 9])),
                (
                    "publication_date",
                    std::sync::Arc::new(arrow_array::Int32Array::from(vec![1900; 9])),
                ),
                ("url", utf8(&["u"; 9])),
                ("text", utf8(&texts)),
            ],
            2,
            Strings::Dictionary,
        );
    }
    let opts = SourceOptions::with_dataset_dir("pg19", dir.path());
    let files = split_files(registry::lookup("pg19").unwrap(), Split::Train, &opts).unwrap();
    assert_eq!(files.len(), 2);
    (dir, files)
}

fn stream_at(files: &[std::path::PathBuf], at: data::source::StreamPosition) -> ExampleStream {
    ExampleStream::open_at(registry::lookup("pg19").unwrap(), files.to_vec(), at).unwrap()
}

#[test]
fn packing_masking_and_corruption_resume_exactly() {
    let (_dir, files) = books();
    let tok = Tok::bytes();
    let window = 61; // odd, so windows straddle documents and row groups

    // Uninterrupted: every window, with its masked and corrupted forms.
    let run = |state: Option<(PackState, BertMasking, SpanCorruption)>| {
        let (pack, mut mlm, mut span) = state.unwrap_or((
            PackState::default(),
            BertMasking::new(1),
            SpanCorruption::new(2),
        ));
        let mut docs = stream_at(&files, pack.doc);
        let mut packer = Packer::resume(window, tok.eos_id(), pack);
        let mut out = Vec::new();
        let mut states = Vec::new();
        while let Some(w) = packer.next_window(&mut docs, &tok).unwrap() {
            let m = mlm.apply(&w, &tok);
            let s = span.apply(&w, &tok);
            out.push((w, m, s));
            // Save what a checkpoint would save, through JSON.
            let saved = serde_json::to_string(&(packer.state(), &mlm, &span)).unwrap();
            states.push(
                serde_json::from_str::<(PackState, BertMasking, SpanCorruption)>(&saved).unwrap(),
            );
        }
        (out, states)
    };
    let (all, states) = run(None);
    assert!(all.len() > 30, "only {} windows", all.len());
    for k in [1, 7, 18, all.len() / 2, all.len() - 1] {
        let (rest, _) = run(Some(states[k - 1].clone()));
        assert_eq!(rest.len(), all.len() - k, "resume after window {k}");
        assert!(rest == all[k..], "resumed stream differs after window {k}");
    }
    // The stream really crossed files and rows.
    assert_eq!(
        states.last().unwrap().0.doc.file,
        1,
        "{:?}",
        states.iter().map(|s| s.0).collect::<Vec<_>>()
    );
}

#[test]
fn t5_span_corruption_statistics() {
    assert_eq!(t5_span_lengths(512, 0.15, 3.0), (568, 114));
    assert_eq!(t5_span_lengths(626, 0.15, 3.0).1, 140);
    let tok = Tok::bytes();
    let mut span = SpanCorruption::new(0);
    let raw: Vec<u32> = (0..568).map(|i| 3 + (i % 250) as u32).collect();
    let (mut noise, mut spans, mut span_tokens) = (0usize, 0usize, 0usize);
    let mut lengths = vec![0usize; 40];
    for _ in 0..200 {
        let mask = span.noise_mask(raw.len());
        assert!(!mask[0], "T5 starts with a non-noise span");
        noise += mask.iter().filter(|&&m| m).count();
        let mut run = 0;
        for (i, &m) in mask.iter().enumerate() {
            if m {
                run += 1;
            }
            if run > 0 && (!m || i + 1 == mask.len()) {
                spans += 1;
                span_tokens += run;
                lengths[run.min(39)] += 1;
                run = 0;
            }
        }
        let ex = span.apply(&raw, &tok);
        // Exact lengths of the paper's setting.
        assert_eq!((ex.inputs.len(), ex.targets.len()), (512, 114));
        // Sentinels in order, counting down from the top id, the same in inputs and targets.
        let sentinels = |v: &[u32]| v.iter().copied().filter(|&t| t > 258).collect::<Vec<_>>();
        let expected: Vec<u32> = (0..28).map(|i| tok.sentinel_id(i)).collect();
        assert_eq!(sentinels(&ex.inputs), expected);
        assert_eq!(sentinels(&ex.targets), expected);
        assert_eq!(*ex.inputs.last().unwrap(), tok.eos_id());
        // Undo the corruption: put each target span back in place of its sentinel.
        let mut spans_of = std::collections::HashMap::new();
        let mut cur = None;
        for &t in &ex.targets[..ex.targets.len() - 1] {
            if t > 258 {
                cur = Some(t);
                spans_of.insert(t, Vec::new());
            } else {
                spans_of.get_mut(&cur.unwrap()).unwrap().push(t);
            }
        }
        let restored: Vec<u32> = ex.inputs[..ex.inputs.len() - 1]
            .iter()
            .flat_map(|t| {
                if *t > 258 {
                    spans_of[t].clone()
                } else {
                    vec![*t]
                }
            })
            .collect();
        assert_eq!(restored, raw);
    }
    assert_eq!(
        noise,
        200 * 85,
        "noise density: 85 of 568 tokens every time"
    );
    assert_eq!(spans, 200 * 28);
    let mean = span_tokens as f64 / spans as f64;
    assert!((mean - 85.0 / 28.0).abs() < 1e-9);
    // Span lengths vary (random segmentation), mostly short.
    assert!(
        lengths[1] > 0 && lengths[2] > 0 && lengths[5..].iter().sum::<usize>() > 0,
        "{lengths:?}"
    );
}

#[test]
fn bert_masking_proportions() {
    let tok = Tok::bytes();
    let mut m = BertMasking::new(3);
    let tokens: Vec<u32> = (0..1000).map(|i| 3 + (i % 200) as u32).collect();
    let (mut selected, mut masked, mut random, mut kept) = (0, 0, 0, 0);
    for _ in 0..100 {
        let ex = m.apply(&tokens, &tok);
        for (i, &l) in ex.labels.iter().enumerate() {
            if l == NO_LOSS {
                assert_eq!(ex.inputs[i], tokens[i], "unselected tokens are unchanged");
                continue;
            }
            selected += 1;
            assert_eq!(l, tokens[i] as i64);
            if ex.inputs[i] == tok.mask_id() {
                masked += 1;
            } else if ex.inputs[i] == tokens[i] {
                kept += 1;
            } else {
                random += 1;
                assert!(!tok.is_special(ex.inputs[i]));
            }
        }
    }
    assert_eq!(selected, 100 * 150, "exactly 15% per window");
    let frac = |n: usize| n as f64 / selected as f64;
    assert!((frac(masked) - 0.8).abs() < 0.02, "{}", frac(masked));
    assert!((frac(random) - 0.1).abs() < 0.02, "{}", frac(random));
    assert!((frac(kept) - 0.1).abs() < 0.02, "{}", frac(kept));
}

#[test]
fn seq2seq_and_qa_truncate_to_task_lengths() {
    let tok = Tok::bytes();
    let task = Seq2SeqTask {
        input_length: 16,
        target_length: 8,
    };
    let ex = task
        .build(
            &Example::Seq2Seq {
                source: "a".repeat(100),
                target: "bcd".into(),
            },
            &tok,
        )
        .unwrap();
    assert_eq!(ex.inputs.len(), 16);
    assert_eq!(
        ex.targets,
        [tok.encode("bcd").unwrap(), vec![tok.eos_id()]].concat()
    );
    let qa = Example::Qa {
        question: "Who?".into(),
        context: "Ham: hi".into(),
        answers: vec!["Ham".into(), "Hamlet".into()],
    };
    let ex = Seq2SeqTask {
        input_length: 512,
        target_length: 16,
    }
    .build(&qa, &tok)
    .unwrap();
    assert_eq!(
        tok.decode(&ex.inputs).unwrap(),
        "question: Who? context: Ham: hi"
    );
    assert_eq!(tok.decode(&ex.targets).unwrap(), "Ham");
    assert_eq!(ex.references, ["Ham", "Hamlet"]);
}

#[test]
fn example_streams_reopen_at_every_position() {
    let dir = tempfile::tempdir().unwrap();
    write_all_fixtures(dir.path());
    for (name, split) in [
        ("c4", Split::Train),
        ("multi_news", Split::Validation),
        ("wiki40b", Split::Train),
    ] {
        let spec = registry::lookup(name).unwrap();
        let opts = SourceOptions {
            data_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let files = split_files(spec, split, &opts).unwrap();
        let mut stream = ExampleStream::open_at(spec, files.clone(), Default::default()).unwrap();
        let mut positions = vec![stream.position()];
        let mut all = Vec::new();
        while let Some(e) = stream.next() {
            all.push(e.unwrap());
            positions.push(stream.position());
        }
        assert!(all.len() >= 2, "{name}");
        for (k, at) in positions.iter().enumerate() {
            let rest: Vec<Example> = ExampleStream::open_at(spec, files.clone(), *at)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert_eq!(rest, all[k..], "{name} reopened at {at:?}");
        }
    }
}

#[test]
fn epoch_streams_shuffle_by_seed_and_resume_exactly() {
    use data::epochs::{EpochStream, Shuffle};
    let (_dir, files) = books();
    let spec = registry::lookup("pg19").unwrap();
    let in_file_order: Vec<Example> = stream_at(&files, Default::default())
        .map(Result::unwrap)
        .collect();
    let n = in_file_order.len();
    let draw = |shuffle: Shuffle, k: usize| -> Vec<Example> {
        let mut s = EpochStream::open(spec, files.clone(), shuffle).unwrap();
        (0..k).map(|_| s.next_example().unwrap()).collect()
    };
    // A buffer of 1 keeps the files' order, epoch after epoch.
    let plain = draw(Shuffle { buffer: 1, seed: 7 }, 2 * n);
    assert_eq!(plain[..n], in_file_order[..]);
    assert_eq!(plain[n..], in_file_order[..]);
    // A buffer reorders each epoch, which is still every example once.
    let sorted = |mut v: Vec<Example>| {
        v.sort_by_key(|e| format!("{e:?}"));
        v
    };
    let a = draw(Shuffle { buffer: 8, seed: 1 }, 2 * n);
    for epoch in a.chunks(n) {
        assert_eq!(sorted(epoch.to_vec()), sorted(in_file_order.clone()));
    }
    assert_ne!(
        a[..n],
        in_file_order[..],
        "a buffer of 8 left 18 examples in order"
    );
    assert_ne!(a[..n], a[n..], "two epochs drew the same order");
    // The seed decides the order: the same seed repeats it, another changes it.
    assert_eq!(draw(Shuffle { buffer: 8, seed: 1 }, 2 * n), a);
    assert_ne!(draw(Shuffle { buffer: 8, seed: 2 }, 2 * n), a);
    // Restored at any point of either epoch, the stream continues exactly as it would have.
    for k in [0, 1, 5, n - 1, n, n + 3, 2 * n - 1] {
        let shuffle = Shuffle { buffer: 8, seed: 1 };
        let mut first = EpochStream::open(spec, files.clone(), shuffle).unwrap();
        for _ in 0..k {
            first.next_example().unwrap();
        }
        let mut resumed = EpochStream::open(spec, files.clone(), shuffle).unwrap();
        resumed.restore(first.state()).unwrap();
        let rest: Vec<Example> = (k..2 * n)
            .map(|_| resumed.next_example().unwrap())
            .collect();
        assert_eq!(rest, a[k..], "resumed after {k} examples");
    }
}

#[test]
fn reconstruction_targets_are_the_whole_window_with_span_corruption_inputs() {
    let tok = Tok::bytes();
    let raw: Vec<u32> = (0..142).map(|i| 3 + (i * 7 % 250) as u32).collect();
    for seed in 0..5 {
        let (mut a, mut b) = (SpanCorruption::new(seed), SpanCorruption::new(seed));
        let span = a.apply_objective(&raw, &tok, PretrainObjective::SpanCorruption);
        let rec = b.apply_objective(&raw, &tok, PretrainObjective::Reconstruct);
        // Same noise, same inputs: only the targets differ.
        assert_eq!(rec.inputs, span.inputs);
        assert_eq!(span, SpanCorruption::new(seed).apply(&raw, &tok));
        let mut expected = raw.clone();
        expected.push(tok.eos_id());
        assert_eq!(rec.targets, expected);
        // The inputs keep every non-noise token in order: the targets' copyable part.
        let kept: Vec<u32> = rec.inputs.iter().copied().filter(|&t| t <= 258).collect();
        assert!(kept.len() < raw.len() && kept.len() > raw.len() / 2);
        assert_eq!(b.rng, a.rng, "both objectives draw the same noise");
    }
}

#[test]
fn objective_target_lengths_are_what_the_corruption_writes() {
    let tok = Tok::bytes();
    let (raw_len, _) = t5_span_lengths(128, 0.15, 3.0);
    let raw: Vec<u32> = (0..raw_len).map(|i| 3 + (i % 250) as u32).collect();
    for objective in [
        PretrainObjective::SpanCorruption,
        PretrainObjective::Reconstruct,
    ] {
        let ex = SpanCorruption::new(3).apply_objective(&raw, &tok, objective);
        assert_eq!(
            ex.targets.len(),
            objective.target_length(128),
            "{objective:?}"
        );
    }
}

#[test]
fn random_copy_examples_are_non_special_tokens_copied_whole() {
    let tok = Tok::bytes();
    let (raw_len, _) = t5_span_lengths(128, 0.15, 3.0);
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..5 {
        let mut corruption = SpanCorruption::new(seed);
        let ex = corruption.random_copy(raw_len, &tok);
        let (drawn, eos) = ex.targets.split_at(raw_len);
        assert_eq!(eos, [tok.eos_id()], "the target ends with EOS");
        assert!(
            drawn.iter().all(|&t| !tok.is_special(t)),
            "no pad, EOS or sentinel drawn"
        );
        seen.extend(drawn.iter().copied());
        // The same length as a text window's reconstruction, and the inputs are the drawn
        // sequence corrupted: its kept tokens in order, one sentinel per noise span.
        assert_eq!(
            ex.targets.len(),
            PretrainObjective::Reconstruct.target_length(128)
        );
        let kept: Vec<u32> = ex
            .inputs
            .iter()
            .copied()
            .filter(|&t| !tok.is_special(t))
            .collect();
        let mut rest = drawn.iter();
        assert!(
            kept.iter().all(|k| rest.any(|d| d == k)),
            "kept tokens are a subsequence"
        );
        assert!(kept.len() < raw_len && kept.len() > raw_len / 2);
    }
    // Uniform over the non-special ids: 5 × 142 draws from 256 ids cover most of them.
    assert!(seen.len() > 200, "{} distinct ids", seen.len());
}

#[test]
fn copy_warmup_examples_are_their_own_targets_with_eos() {
    let tok = Tok::bytes();
    let mut rng = data::rng::SplitMix64::new(3);
    let mut rows = Vec::new();
    for len in [1, 16, 32] {
        let ex = random_copy_example(&mut rng, len, &tok);
        assert_eq!(
            ex.inputs, ex.targets,
            "len {len}: input = target (no corruption)"
        );
        assert_eq!(ex.inputs.len(), len + 1, "len {len}: the drawn ids and EOS");
        assert_eq!(ex.inputs.last(), Some(&tok.eos_id()));
        assert!(ex.inputs[..len].iter().all(|&t| !tok.is_special(t)));
        rows.push(ex.inputs);
    }
    // Successive draws differ (the rng advances), and the same seed repeats them.
    assert_ne!(rows[1][..16], rows[2][..16]);
    let mut again = data::rng::SplitMix64::new(3);
    let _ = random_copy_example(&mut again, 1, &tok);
    assert_eq!(random_copy_example(&mut again, 16, &tok).inputs, rows[1]);
}
