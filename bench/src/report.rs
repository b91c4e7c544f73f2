//! What every bench's Markdown report shares: medians, number formats, the machine's
//! load average, and the generated block each bench rewrites in a doc between its
//! own two markers.

use anyhow::Result;
use std::path::Path;

/// The median of the finite values in `v` (NaN when there are none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `x` with `d` decimals, "–" when it is not finite.
pub(crate) fn fixed(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "–".into()
    }
}

/// `x` rounded to an integer, thousands separated by a narrow no-break space;
/// "–" when it is not finite.
pub(crate) fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let s = format!("{:.0}", x);
    let digits = s.trim_start_matches('-');
    let mut out = String::from(&s[..s.len() - digits.len()]);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out
}

/// "uncoalesced" for `train` 1, else "GRO trains of `train`".
pub(crate) fn mode_name(train: usize) -> String {
    if train == 1 {
        "uncoalesced".into()
    } else {
        format!("GRO trains of {train}")
    }
}

/// The three load averages of a /proc/loadavg text.
pub(crate) fn loadavg(text: &str) -> String {
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// /proc/loadavg now, as `loadavg` shows it.
pub(crate) fn loadavg_now() -> String {
    loadavg(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default())
}

/// What `cmd args` prints (stdout, or stderr when stdout is empty), trimmed; "?" when
/// it cannot run.
pub(crate) fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(if o.stdout.is_empty() { &o.stderr } else { &o.stdout }).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// Replaces the block from the line starting with `begin` to `end` in the doc at
/// `path` with `block` (which carries both markers), or appends `block` when the doc
/// has none; a missing doc is started with a "# Benchmarks" heading.
pub(crate) fn replace_block(path: &Path, begin: &str, end: &str, block: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &old[..b], block.trim_end(), &old[e + end.len()..]),
        _ => format!("{}\n\n{}", old.trim_end(), block),
    };
    std::fs::write(path, new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_numbers() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
        assert_eq!(thousands(1_234_567.0), "1\u{202f}234\u{202f}567");
        assert_eq!(thousands(-1_234.0), "-1\u{202f}234");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(f64::NAN), "–");
        assert_eq!(fixed(0.12345, 3), "0.123");
        assert_eq!(fixed(f64::INFINITY, 3), "–");
        assert_eq!(loadavg("1.00 2.00 3.00 1/200 42\n"), "1.00 2.00 3.00");
    }

    #[test]
    fn the_doc_block_is_replaced_in_place_or_appended() {
        const B: &str = "<!-- x: begin";
        const E: &str = "<!-- x: end -->";
        let p = std::env::temp_dir().join(format!("bench-report-doc-{}.md", std::process::id()));
        std::fs::write(&p, format!("# B\n\nbefore\n{B} x -->\nold\n{E}\nafter\n")).unwrap();
        replace_block(&p, B, E, &format!("{B} y -->\nnew\n{E}\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("# B\n\nbefore\n{B} y -->\nnew\n{E}\nafter\n"));
        std::fs::write(&p, "# B\n\ntext\n").unwrap();
        replace_block(&p, B, E, &format!("{B} y -->\nnew\n{E}\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("# B\n\ntext\n\n{B} y -->\nnew\n{E}\n"));
        std::fs::remove_file(&p).unwrap();
    }
}
