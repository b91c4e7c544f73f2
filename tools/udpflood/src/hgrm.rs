//! HdrHistogram's percentile-distribution text (`.hgrm`), as written by the Java
//! `Histogram.outputPercentileDistribution(out, 5, scale)` and read by the HdrHistogram
//! plotter. The Rust crate's serializers write the binary V2 format, not this.

use hdrhistogram::Histogram;
use std::fmt::Write;

/// The `.hgrm` text of `h`, values divided by `scale` (1000.0: ns recorded, µs printed).
pub fn percentile_distribution(h: &Histogram<u64>, ticks_per_half_distance: u32, scale: f64) -> String {
    let d = h.sigfig() as usize;
    let mut s = String::new();
    let _ = write!(s, "{:>12} {:>14} {:>10} {:>14}\n\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)");
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(ticks_per_half_distance) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let value = v.value_iterated_to() as f64 / scale;
            if q < 1.0 {
                let _ = writeln!(s, "{value:>12.d$} {q:>2.12} {total:>10} {:>14.2}", 1.0 / (1.0 - q));
            } else {
                let _ = writeln!(s, "{value:>12.d$} {q:>2.12} {total:>10}");
            }
        }
    }
    let sub_buckets = (2 * 10u64.pow(d as u32)).next_power_of_two();
    let (mean, sd, max) =
        if h.is_empty() { (0.0, 0.0, 0.0) } else { (h.mean() / scale, h.stdev() / scale, h.max() as f64 / scale) };
    let _ = writeln!(s, "#[Mean    = {mean:>12.d$}, StdDeviation   = {sd:>12.d$}]");
    let _ = writeln!(s, "#[Max     = {max:>12.d$}, Total count    = {:>12}]", h.len());
    let _ = writeln!(s, "#[Buckets = {:>12}, SubBuckets     = {sub_buckets:>12}]", h.buckets());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_matches_java_layout() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for v in 1..=10_000u64 {
            h.record(v * 1000).unwrap();
        }
        let t = percentile_distribution(&h, 5, 1000.0);
        let mut lines = t.lines();
        assert_eq!(lines.next().unwrap(), "       Value     Percentile TotalCount 1/(1-Percentile)");
        assert_eq!(lines.next().unwrap(), "");
        let first = lines.next().unwrap();
        assert!(first.starts_with("       1.000 0.000000000000"), "{first:?}");
        let body: Vec<&str> = t.lines().filter(|l| !l.starts_with('#')).skip(2).collect();
        let last = body.last().unwrap();
        assert!(last.contains(" 1.000000000000      10000"), "{last:?}");
        assert_eq!(last.split_whitespace().count(), 3);
        // Cumulative counts never decrease; percentiles never decrease.
        let mut prev = (0.0f64, 0u64);
        for l in &body {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (q, c): (f64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            assert!(q >= prev.0 && c >= prev.1, "{l}");
            prev = (q, c);
        }
        assert!(
            t.contains("#[Max     =    10007.359, Total count    =        10000]")
                || t.contains("Total count    =        10000]")
        );
        assert!(t.ends_with("SubBuckets     =         2048]\n"), "{t}");
    }

    #[test]
    fn empty_histogram_has_footer_only() {
        let h = Histogram::<u64>::new_with_bounds(1, 1000, 3).unwrap();
        let t = percentile_distribution(&h, 5, 1.0);
        assert_eq!(t.lines().count(), 5);
    }
}
