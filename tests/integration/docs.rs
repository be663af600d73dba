//! Every relative link in README.md and docs/*.md resolves: the file it
//! names exists, and a `#anchor` names a heading of the target (GitHub's
//! slug of it). No server needed; std only.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines outside fenced code blocks, with their line numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// `line` without its inline code spans (`...`), which hold no links.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links and images `[text](target "title")` and
/// of the reference definitions `[label]: target` on one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(end) = t.find("]:") {
            targets.push(t[end + 2..].split_whitespace().next().unwrap_or("").to_string());
        }
    }
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let mut depth = 0;
        let mut end = after.len();
        for (j, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = j;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let inner = after[..end].trim();
        let target = inner.split_whitespace().next().unwrap_or("");
        targets.push(target.trim_start_matches('<').trim_end_matches('>').to_string());
        rest = &after[end.min(after.len())..];
    }
    targets
}

/// GitHub's anchor for a heading: its text as shown (no code ticks, link
/// targets or emphasis), lower case, letters, digits, `-` and `_` kept,
/// spaces as `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut shown = String::new();
    let mut rest = heading;
    // [text](target) shows as text.
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").map(|m| open + m) {
            Some(mid) => {
                let close = rest[mid..].find(')').map_or(rest.len(), |c| mid + c + 1);
                shown.push_str(&rest[..open]);
                shown.push_str(&rest[open + 1..mid]);
                rest = &rest[close..];
            }
            None => break,
        }
    }
    shown.push_str(rest);
    shown
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a Markdown file: the slugs of its ATX headings, the n-th
/// repeat of a slug with `-n` appended, as GitHub does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(text);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with one link from `file`, if anything.
fn check(file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let resolved = if path.is_empty() { file.to_path_buf() } else { file.parent().unwrap().join(path) };
    let shown = resolved.strip_prefix(root()).unwrap_or(&resolved).display().to_string();
    if !resolved.exists() {
        return Some(format!("{shown} does not exist"));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return Some(format!("an anchor into {shown}, which is not Markdown"));
    }
    let text = std::fs::read_to_string(&resolved).unwrap();
    if anchors(&text).contains(anchor) {
        None
    } else {
        Some(format!("{shown} has no heading with the anchor #{anchor}"))
    }
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut relative = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if !target.contains("://") && !target.starts_with("mailto:") {
                    relative += 1;
                }
                if let Some(why) = check(&file, &target) {
                    broken.push(format!("{name}:{n}: ({target}): {why}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(relative >= 10, "found only {relative} relative links: is the link parser still right?");
}

#[test]
fn the_checker_sees_what_github_shows() {
    assert_eq!(slug("FLOCK — a fair distributed lock inside Redis"), "flock--a-fair-distributed-lock-inside-redis");
    assert_eq!(slug("Durability, replication, failover, cluster"), "durability-replication-failover-cluster");
    assert_eq!(
        slug("FLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] [SESSION] [ID request-id]"),
        "flockacquire-key-owner-lease-ms-wait-timeout-ms-session-id-request-id"
    );
    assert_eq!(slug("`INFO flock` and [keyspace events](x.md)"), "info-flock-and-keyspace-events");
    assert_eq!(slug("contended hold=100us"), "contended-hold100us");
    let a = anchors("# A\n```\n# Not a heading\n```\n## A\n#nope\n");
    assert_eq!(a, HashSet::from(["a".to_string(), "a-1".to_string()]));
    assert_eq!(
        link_targets("see [x](docs/a.md#b), ![c](d.svg \"t\") and `[e](not-a-link)`"),
        vec!["docs/a.md#b", "d.svg"]
    );
    assert!(check(&root().join("README.md"), "docs/no-such-file.md").is_some());
    assert!(check(&root().join("README.md"), "#no-such-heading").is_some());
}

/// The codes of the errors in `text` (Rust source): the first word of each
/// string literal that starts with an upper-case word and a space.
fn error_codes(text: &str) -> HashSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter_map(|literal| literal.split_once(' ').map(|(code, _)| code))
        .filter(|code| code.len() >= 3 && code.chars().all(|c| c.is_ascii_uppercase()))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_command_reference_lists_every_error_code_the_module_answers() {
    let errors = std::fs::read_to_string(root().join("src/errors.rs")).expect("src/errors.rs");
    let reference = std::fs::read_to_string(root().join("docs/commands.md")).expect("docs/commands.md");
    let codes = error_codes(&errors);
    for code in ["NOTOWNER", "LOCKDELETED", "ERR", "WRONGTYPE"] {
        assert!(codes.contains(code), "the scan finds {code} in src/errors.rs: {codes:?}");
    }
    let missing: Vec<&String> = codes.iter().filter(|code| !reference.contains(&format!("`{code} "))).collect();
    assert!(missing.is_empty(), "docs/commands.md does not list the error codes {missing:?}");
}

#[test]
fn only_the_errors_module_writes_error_texts() {
    for entry in std::fs::read_dir(root().join("src")).expect("src/") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("errors.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for made in ["RedisError::Str(\"", "RedisError::String(format!(\"", "RedisError::String(\""] {
            assert!(
                !text.contains(made),
                "{} writes an error text ({made}...): it belongs in src/errors.rs",
                path.display()
            );
        }
    }
}
