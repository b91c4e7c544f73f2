//! `--cores` parsing and validation against the cores this process may run on.

use anyhow::{bail, Context, Result};

/// Parses `0-3`, `0,2`, `0-1,3` into a sorted, de-duplicated list.
pub fn parse(list: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("--cores {list:?}: empty element");
        }
        let num = |s: &str| -> Result<usize> {
            s.trim().parse::<usize>().with_context(|| format!("--cores {list:?}: {s:?} is not a core number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    bail!("--cores {list:?}: range {a}-{b} is reversed");
                }
                if b - a > 4096 {
                    bail!("--cores {list:?}: range {a}-{b} is too large");
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Compact text of a core list (`0-1,3`), for messages.
pub fn format(cores: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cores[i].to_string() } else { format!("{}-{}", cores[i], cores[j]) });
        i = j + 1;
    }
    parts.join(",")
}

/// The requested cores as core_affinity ids; error naming the available ones when
/// any is missing from this process's affinity mask.
pub fn resolve(list: &str) -> Result<Vec<core_affinity::CoreId>> {
    let wanted = parse(list)?;
    let available = core_affinity::get_core_ids().context("cannot read this process's CPU affinity")?;
    let avail_ids: Vec<usize> = {
        let mut v: Vec<usize> = available.iter().map(|c| c.id).collect();
        v.sort_unstable();
        v
    };
    let missing: Vec<usize> = wanted.iter().copied().filter(|c| !avail_ids.contains(c)).collect();
    if !missing.is_empty() {
        bail!(
            "--cores {list}: core(s) {} not available; this machine (affinity mask) has cores {}",
            format(&missing),
            format(&avail_ids)
        );
    }
    Ok(wanted.into_iter().map(|id| core_affinity::CoreId { id }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        assert_eq!(parse("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse("0,2").unwrap(), vec![0, 2]);
        assert_eq!(parse("3,0-1, 1").unwrap(), vec![0, 1, 3]);
        assert!(parse("").is_err());
        assert!(parse("a").is_err());
        assert!(parse("3-1").is_err());
        assert!(parse("0-").is_err());
        assert!(parse("0-99999999").is_err());
        assert_eq!(format(&[0, 1, 3, 5, 6, 7]), "0-1,3,5-7");
    }
}
