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

/// A distribution-free confidence interval for a median: two order statistics of
/// the values and the probability that the true median lies between them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MedianInterval {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    pub(crate) coverage: f64,
}

/// The interval x(k) … x(n+1−k) of the `n` finite values of `v` (sorted) around their
/// median, with the largest `k` whose coverage 1 − 2·P(Bin(n, ½) < k) is at least
/// `level` (the sign test's interval: each value falls below the true median with
/// probability ½, rounds being independent). With too few values for `level` (fewer
/// than six at 95 %) it is the smallest and the largest value, with the coverage they
/// have. `None` for fewer than two values.
pub(crate) fn median_interval(mut v: Vec<f64>, level: f64) -> Option<MedianInterval> {
    v.retain(|x| x.is_finite());
    let n = v.len();
    if n < 2 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    // P(Bin(n, ½) = i), in logs so that no term underflows for large n.
    let ln_half_n = n as f64 * 0.5f64.ln();
    let mut ln_p = ln_half_n; // i = 0
    let mut below = 0.0; // P(Bin < k), k = 1 at the start: P(Bin = 0)
    below += ln_p.exp();
    let coverage = |below: f64| (1.0 - 2.0 * below).max(0.0);
    let mut k = 1;
    loop {
        // Try k + 1: adds P(Bin = k).
        if k + 1 > n.div_ceil(2) {
            break;
        }
        ln_p += ((n - k + 1) as f64 / k as f64).ln();
        let next = below + ln_p.exp();
        if coverage(next) < level {
            break;
        }
        below = next;
        k += 1;
    }
    Some(MedianInterval { lo: v[k - 1], hi: v[n - k], coverage: coverage(below) })
}

/// Prints `text`, then writes what `out` asks for: `text` as the block between
/// `begin` and `end` of `out.doc`, `svg()` to `out.svg`, `json()` to `out.json`.
pub(crate) fn write_outputs(
    out: &crate::cli::Outputs,
    (begin, end): (&str, &str),
    text: &str,
    svg: impl FnOnce() -> String,
    json: impl FnOnce() -> serde_json::Value,
) -> Result<()> {
    println!("{text}");
    if let Some(p) = &out.doc {
        replace_block(p, begin, end, text)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &out.svg {
        std::fs::write(p, svg())?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &out.json {
        std::fs::write(p, serde_json::to_string_pretty(&json())?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sign test's coverage, counted: of the 2^n ways the n values can fall below
    /// or above the true median, the share with at least k below and at least k above.
    fn coverage_by_enumeration(n: usize, k: usize) -> f64 {
        let inside = (0u32..1 << n).filter(|m| {
            let below = m.count_ones() as usize;
            below >= k && n - below >= k
        });
        inside.count() as f64 / (1u64 << n) as f64
    }

    #[test]
    fn median_interval_against_enumeration() {
        for n in 2..=18 {
            let v: Vec<f64> = (0..n).rev().map(|i| i as f64 * 10.0).collect();
            for level in [0.5, 0.9, 0.95, 0.99] {
                let ci = median_interval(v.clone(), level).unwrap();
                // x(k) is k − 1 after sorting 0, 10, 20, …
                let k = (ci.lo / 10.0) as usize + 1;
                assert_eq!(ci.hi, (n - k) as f64 * 10.0, "n {n} level {level}: symmetric");
                let want = coverage_by_enumeration(n, k);
                assert!((ci.coverage - want).abs() < 1e-9, "n {n} k {k}: {} vs {want}", ci.coverage);
                if k > 1 {
                    assert!(want >= level, "n {n} k {k}: {want} below {level}");
                }
                // The largest such k: one more would fall short of the level (or cross the median).
                if k < n.div_ceil(2) {
                    assert!(coverage_by_enumeration(n, k + 1) < level, "n {n} level {level}: k {k} not the largest");
                }
                if k == 1 && n >= 2 {
                    assert_eq!((ci.lo, ci.hi), (0.0, (n - 1) as f64 * 10.0));
                }
            }
        }
        // Textbook values: n = 30 at 95 %: x(10) … x(21), 95.7 %; n = 5: min … max, 93.75 %.
        let v: Vec<f64> = (1..=30).map(f64::from).collect();
        let ci = median_interval(v, 0.95).unwrap();
        assert_eq!((ci.lo, ci.hi), (10.0, 21.0));
        assert!((ci.coverage - 0.9572).abs() < 1e-4, "{}", ci.coverage);
        let ci = median_interval(vec![5.0, 1.0, f64::NAN, 3.0, 2.0, 4.0], 0.95).unwrap();
        assert_eq!((ci.lo, ci.hi, ci.coverage), (1.0, 5.0, 0.9375));
        assert_eq!(median_interval(vec![1.0], 0.95), None);
        // Large n does not underflow: 2 000 values still give a narrow interval.
        let v: Vec<f64> = (0..2000).map(f64::from).collect();
        let ci = median_interval(v, 0.95).unwrap();
        assert!(ci.lo > 900.0 && ci.hi < 1100.0 && ci.coverage >= 0.95, "{ci:?}");
    }

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
