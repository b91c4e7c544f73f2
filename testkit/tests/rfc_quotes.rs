//! RFC quotes in the code, the way s2n-quic writes them: a line
//! `//= https://www.rfc-editor.org/rfc/rfcNNNN#section-X.Y` names the section, and the
//! `//#` lines right after it quote that section's text verbatim (re-wrapped).
//!
//! Every `//=` in a `src/` file of the workspace must be well formed and followed by
//! at least one `//#` line; every quote must appear, word for word, in the section it
//! names of the RFC excerpt committed under docs/rfc/ (`rfcNNNN.txt`, whole sections
//! as the RFC Editor's plain text has them); and the files that implement the packet
//! formats carry quotes.

#![allow(clippy::unwrap_used)] // a test: its own set-up may panic

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const TARGET_PREFIX: &str = "https://www.rfc-editor.org/rfc/rfc";

/// Files that must quote the RFCs they implement, with the least number of quotes each.
const MUST_QUOTE: [(&str, usize); 6] = [
    ("proto/src/retry.rs", 10),
    ("proto/src/version_negotiation.rs", 5),
    ("proto/src/token.rs", 5),
    ("proto/src/header.rs", 5),
    ("proto/src/initial.rs", 3),
    ("proto/src/initial_protection.rs", 3),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// One `//=` and the `//#` lines after it.
#[derive(Debug)]
struct Quote {
    /// `file:line` of the `//=` line.
    at: String,
    rfc: u32,
    section: String,
    text: String,
}

/// `rfcNNNN#section-X.Y` of a `//=` target: (NNNN, "X.Y"), or why it is malformed.
fn parse_target(target: &str) -> Result<(u32, String), String> {
    let rest =
        target.strip_prefix(TARGET_PREFIX).ok_or_else(|| format!("not {TARGET_PREFIX}NNNN#section-X: {target}"))?;
    let (number, section) = rest.split_once("#section-").ok_or_else(|| format!("no #section- in {target}"))?;
    let rfc = number.parse::<u32>().map_err(|_| format!("bad RFC number in {target}"))?;
    let numbered = !section.is_empty()
        && section.split('.').all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()));
    if !numbered {
        return Err(format!("bad section in {target}"));
    }
    Ok((rfc, section.to_string()))
}

/// The quotes of one file's text, or the first malformed one.
fn quotes_in(name: &str, src: &str) -> Result<Vec<Quote>, String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut quotes = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if let Some(target) = line.strip_prefix("//=") {
            let at = format!("{name}:{}", i + 1);
            let (rfc, section) = parse_target(target.trim()).map_err(|e| format!("{at}: {e}"))?;
            let mut text = Vec::new();
            i += 1;
            while let Some(q) = lines.get(i).and_then(|l| l.trim_start().strip_prefix("//#")) {
                text.push(q.trim());
                i += 1;
            }
            if text.iter().all(|t| t.is_empty()) {
                return Err(format!("{at}: //= not followed by a //# quote"));
            }
            quotes.push(Quote { at, rfc, section, text: text.join(" ") });
        } else if line.starts_with("//#") {
            return Err(format!("{name}:{}: //# without a //= above it", i + 1));
        } else {
            i += 1;
        }
    }
    Ok(quotes)
}

/// Text with runs of white space made one space, and a line break after a hyphen
/// inside a word (`Pseudo-` / `Packet`) dropped, as the RFC's plain text wraps there.
fn normalize(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let joins = out.ends_with('-') && out[..out.len() - 1].ends_with(|c: char| c.is_ascii_alphanumeric());
        if !out.is_empty() && !joins {
            out.push(' ');
        }
        out.push_str(&line.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

/// A section's number if `line` is a section heading (`17.2.5.  Retry Packet`).
fn heading(line: &str) -> Option<&str> {
    let (number, title) = line.split_once(".  ")?;
    let numbered =
        !number.is_empty() && number.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (numbered && title.starts_with(|c: char| !c.is_whitespace())).then_some(number)
}

/// The sections of an RFC excerpt: number to normalized text (heading included).
fn sections(excerpt: &str) -> BTreeMap<String, String> {
    let mut raw: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in excerpt.lines() {
        if let Some(n) = heading(line) {
            current = Some(n.to_string());
        }
        if let Some(n) = &current {
            raw.entry(n.clone()).or_default().push(line);
        }
    }
    raw.into_iter().map(|(n, lines)| (n, normalize(&lines.join("\n")))).collect()
}

/// Why `quote` is not in `sections` word for word, if it is not.
fn check_quote(quote: &Quote, sections: &BTreeMap<String, String>) -> Result<(), String> {
    let text = sections.get(&quote.section).ok_or_else(|| {
        format!("{}: RFC {} §{} is not in docs/rfc/rfc{}.txt", quote.at, quote.rfc, quote.section, quote.rfc)
    })?;
    let wanted = normalize(&quote.text);
    if text.contains(&wanted) {
        return Ok(());
    }
    // Name the first word where the quote departs from every place it could start.
    let words: Vec<&str> = wanted.split(' ').collect();
    let matched = (1..=words.len()).take_while(|&n| text.contains(&words[..n].join(" "))).last().unwrap_or(0);
    Err(format!(
        "{}: not verbatim in RFC {} §{}: after {:?} comes {:?}",
        quote.at,
        quote.rfc,
        quote.section,
        words[..matched].join(" "),
        words.get(matched).copied().unwrap_or("")
    ))
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if e.file_type().unwrap().is_dir() {
            if !name.starts_with('.') && name != "target" {
                rust_sources(&e.path(), out);
            }
        } else if name.ends_with(".rs") {
            out.push(e.path());
        }
    }
}

fn all_quotes() -> Vec<Quote> {
    let mut files = Vec::new();
    rust_sources(root(), &mut files);
    files.sort();
    let mut quotes = Vec::new();
    for f in files {
        let name = f.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(&f).unwrap();
        quotes.extend(quotes_in(&name, &src).unwrap_or_else(|e| panic!("{e}")));
    }
    quotes
}

fn excerpt(rfc: u32) -> BTreeMap<String, String> {
    let path = root().join(format!("docs/rfc/rfc{rfc}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sections(&text)
}

#[test]
fn every_quote_is_verbatim_rfc_text() {
    let quotes = all_quotes();
    let mut excerpts: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
    let mut errors = Vec::new();
    for q in &quotes {
        let sections = excerpts.entry(q.rfc).or_insert_with(|| excerpt(q.rfc));
        if let Err(e) = check_quote(q, sections) {
            errors.push(e);
        }
    }
    assert!(errors.is_empty(), "{} of {} quotes are not RFC text:\n{}", errors.len(), quotes.len(), errors.join("\n"));
}

#[test]
fn packet_format_files_quote_their_rfcs() {
    let quotes = all_quotes();
    for (file, least) in MUST_QUOTE {
        let n = quotes.iter().filter(|q| q.at.starts_with(&format!("{file}:"))).count();
        assert!(n >= least, "{file} has {n} RFC quotes (//= then //#), wants at least {least}");
    }
}

/// A `//=` line for `target` and a `//#` line per quoted line (built at run time, so
/// that this file's own text holds no quote markers).
fn src(target: &str, quoted: &[&str]) -> String {
    let mut s = format!("{}= {target}\n", "//");
    for l in quoted {
        s += &format!("{}# {l}\n", "//");
    }
    s
}

#[test]
fn the_checker_rejects_what_it_should() {
    let sections = excerpt(9000);
    let target = "https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5.2";
    let good = src(target, &["A client MUST discard a Retry packet with a zero-length Retry Token", "field."]);
    let q = quotes_in("t.rs", &good).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!((q[0].rfc, q[0].section.as_str()), (9000, "17.2.5.2"));
    check_quote(&q[0], &sections).unwrap();
    // One word changed, the right text under another section, a section not in the
    // excerpt: each fails.
    let typo = quotes_in("t.rs", &good.replace("zero-length", "zero-lenght")).unwrap();
    assert!(check_quote(&typo[0], &sections).unwrap_err().contains("zero-lenght"));
    let elsewhere = quotes_in("t.rs", &good.replace("17.2.5.2", "17.2.5.1")).unwrap();
    assert!(check_quote(&elsewhere[0], &sections).is_err());
    let absent = quotes_in("t.rs", &good.replace("17.2.5.2", "17.2.5.9")).unwrap();
    assert!(check_quote(&absent[0], &sections).unwrap_err().contains("is not in docs/rfc"));
    // A hyphen the RFC wraps after is joined again: "Pseudo-" / "Packet".
    let pseudo = src(
        "https://www.rfc-editor.org/rfc/rfc9001#section-5.8",
        &["the contents of the Retry Pseudo-Packet, as illustrated in Figure 8:"],
    );
    check_quote(&quotes_in("t.rs", &pseudo).unwrap()[0], &excerpt(9001)).unwrap();
    // Malformed: no quote after the target, bad targets, a quote without a target.
    assert!(quotes_in("t.rs", &(src(target, &[]) + "fn f() {}\n")).is_err());
    for bad in [
        "https://www.rfc-editor.org/rfc/rfc9000#8.1",
        "https://example.org/rfc9000#section-8.1",
        "https://www.rfc-editor.org/rfc/rfc9000#section-8..1",
        "https://www.rfc-editor.org/rfc/rfcX#section-8.1",
    ] {
        assert!(quotes_in("t.rs", &src(bad, &["x"])).is_err(), "{bad}");
    }
    assert!(quotes_in("t.rs", &format!("fn f() {{}}\n{}# stray\n", "//")).is_err());
}
