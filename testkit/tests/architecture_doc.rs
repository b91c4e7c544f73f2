//! docs/architecture.md names every source file: each `.rs` file in a `src/` folder of
//! the workspace appears in it by its path from the repository root, and every path
//! of the workspace it names (a word such as `demux/src/dataplane/retry.rs`) exists.

#![allow(clippy::unwrap_used)] // a test: its own set-up may panic

use std::path::Path;

const DOC: &str = "docs/architecture.md";
/// The kinds of file whose paths the doc may name and must keep true.
const NAMED_EXTENSIONS: [&str; 6] = ["rs", "c", "h", "md", "py", "sh"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The workspace's top-level folders: not hidden, not a build's output.
fn top_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(root())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    dirs.sort();
    dirs
}

/// Every `.rs` file below `dir` with a `src` folder in its path, as a path from the
/// root with `/` separators; skips hidden folders and build outputs (`target`).
fn source_files(dir: &Path, rel: &str, in_src: bool, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let path = format!("{rel}/{name}");
        if e.file_type().unwrap().is_dir() {
            if !name.starts_with('.') && name != "target" {
                source_files(&e.path(), &path, in_src || name == "src", out);
            }
        } else if in_src && name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn all_source_files() -> Vec<String> {
    let mut files = Vec::new();
    for d in top_dirs() {
        source_files(&root().join(&d), &d, false, &mut files);
    }
    files.sort();
    files
}

/// The words of `doc` that are paths into the workspace: they start with a top-level
/// folder and end in one of [`NAMED_EXTENSIONS`].
fn named_paths(doc: &str, tops: &[String]) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    doc.split(|c: char| !is_path_char(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| tops.iter().any(|t| w.starts_with(&format!("{t}/"))))
        .filter(|w| Path::new(w).extension().is_some_and(|x| NAMED_EXTENSIONS.iter().any(|n| x == *n)))
        .map(String::from)
        .collect()
}

#[test]
fn every_source_file_is_named() {
    let doc = std::fs::read_to_string(root().join(DOC)).unwrap();
    let files = all_source_files();
    assert!(files.len() > 100, "found only {} source files under {}", files.len(), root().display());
    let missing: Vec<&String> = files.iter().filter(|f| !doc.contains(f.as_str())).collect();
    assert!(missing.is_empty(), "{DOC} does not name these source files (add a line with its job): {missing:#?}");
}

#[test]
fn every_named_path_exists() {
    let doc = std::fs::read_to_string(root().join(DOC)).unwrap();
    let named = named_paths(&doc, &top_dirs());
    assert!(named.len() > 100, "found only {} paths in {DOC}", named.len());
    let gone: Vec<&String> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(gone.is_empty(), "{DOC} names paths that do not exist: {gone:#?}");
}

#[test]
fn named_paths_are_found_in_text() {
    let tops = vec!["demux".to_string(), "docs".to_string()];
    let doc = "See `demux/src/x.rs`, (demux/src/y.rs). demux/src/z.rs. docs/a.md demux/src/ \
               demux/src/{a,b}.rs other/src/c.rs demux/bench.toml";
    assert_eq!(named_paths(doc, &tops), ["demux/src/x.rs", "demux/src/y.rs", "demux/src/z.rs", "docs/a.md"]);
}
