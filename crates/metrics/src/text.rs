//! Python's string semantics where the references depend on them.

/// Python's `str.isspace()`: Unicode White_Space plus the information separators U+001C–U+001F,
/// which Python (unlike Rust) treats as whitespace in `str.split()`.
pub fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()` with no argument: split on runs of whitespace, no empty pieces.
pub fn py_split(text: &str) -> impl Iterator<Item = &str> {
    text.split(py_is_space).filter(|piece| !piece.is_empty())
}

/// Python's `' '.join(text.split())`.
pub fn py_collapse_whitespace(text: &str) -> String {
    py_split(text).collect::<Vec<_>>().join(" ")
}

/// Python's `str.rstrip()`.
pub fn py_rstrip(text: &str) -> &str {
    text.trim_end_matches(py_is_space)
}

/// A character of Python's `\w` in a `str` pattern: `str.isalnum()` or `_`.
///
/// Rust's `is_alphanumeric` is the Unicode Alphabetic property plus numbers; it differs from
/// Python's letter categories only on combining vowel signs (Other_Alphabetic), which never touch
/// the ASCII words these scores test for.
pub fn py_is_word(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_python_including_information_separators() {
        let pieces: Vec<_> = py_split(" a\u{1c}b\u{a0}c\t\nd  ").collect();
        assert_eq!(pieces, ["a", "b", "c", "d"]);
        assert_eq!(py_rstrip("x \u{1f}\n"), "x");
        assert_eq!(py_collapse_whitespace("  a   b "), "a b");
    }
}
