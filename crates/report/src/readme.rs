//! Generated blocks in hand-written READMEs: a README marks where a generated table goes with
//!
//! ```text
//! <!-- generated: table.md -->
//! ...replaced on every render...
//! <!-- end generated: table.md -->
//! ```
//!
//! and the code that writes `table.md` (or `claims.md`) copies it between the markers, so the
//! numbers a README shows are the generated ones at that commit, never retyped.

use std::path::Path;

use anyhow::{Context, Result, bail};

fn markers(block: &str) -> (String, String) {
    (
        format!("<!-- generated: {block} -->"),
        format!("<!-- end generated: {block} -->"),
    )
}

/// `text` with the lines between the markers of `block` replaced by `content`; `None` when `text`
/// has no such block. An opening marker without its closing one (or the reverse, or a second
/// block of the same name) is an error, since the README would be half-replaced.
pub fn replace_block(text: &str, block: &str, content: &str) -> Result<Option<String>> {
    let (open, close) = markers(block);
    let (Some(start), end) = (text.find(&open), text.find(&close)) else {
        if text.contains(&close) {
            bail!("`{close}` without `{open}` before it");
        }
        return Ok(None);
    };
    let Some(end) = end.filter(|&e| e > start) else {
        bail!("`{open}` without `{close}` after it");
    };
    if text[end + close.len()..].contains(&open) {
        bail!("two blocks `{open}`; keep one");
    }
    let body = content.trim_end_matches('\n');
    Ok(Some(format!(
        "{}{open}\n{body}\n{}",
        &text[..start],
        &text[end..]
    )))
}

/// Fills `block` in the README at `path` with `content` (written atomically), if the README exists
/// and has that block; returns whether it did.
pub fn fill(path: &Path, block: &str, content: &str) -> Result<bool> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(false);
    };
    let Some(new) =
        replace_block(&text, block, content).with_context(|| format!("in {}", path.display()))?
    else {
        return Ok(false);
    };
    if new != text {
        let tmp = path.with_extension("md.tmp");
        std::fs::write(&tmp, &new).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::replace_block;

    const README: &str = "# fig6\n\nintro\n<!-- generated: table.md -->\nold | row\n<!-- end generated: table.md -->\n\nafter\n";

    #[test]
    fn the_block_between_the_markers_is_replaced_and_the_rest_kept() {
        let new = replace_block(README, "table.md", "| a |\n| 1 |\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            new,
            "# fig6\n\nintro\n<!-- generated: table.md -->\n| a |\n| 1 |\n<!-- end generated: table.md -->\n\nafter\n"
        );
        // Filling twice changes nothing more.
        assert_eq!(
            replace_block(&new, "table.md", "| a |\n| 1 |")
                .unwrap()
                .unwrap(),
            new
        );
    }

    #[test]
    fn a_readme_without_the_block_is_left_alone() {
        assert_eq!(replace_block(README, "claims.md", "x").unwrap(), None);
    }

    #[test]
    fn unmatched_or_repeated_markers_are_refused() {
        let open_only = "<!-- generated: t -->\nrow\n";
        let close_only = "row\n<!-- end generated: t -->\n";
        let reversed = "<!-- end generated: t -->\n<!-- generated: t -->\n";
        let twice = "<!-- generated: t -->\n<!-- end generated: t -->\n<!-- generated: t -->\n<!-- end generated: t -->\n";
        for text in [open_only, close_only, reversed, twice] {
            assert!(replace_block(text, "t", "x").is_err(), "{text:?}");
        }
    }
}
