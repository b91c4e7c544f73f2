//! The `--peers` file (docs/scaling.md): one `HOST_ID ADDR:PORT` line per other host
//! (its forwarding address); blank lines and `#` comments ignored.

use std::net::SocketAddr;

/// Parses a `--peers` file. Strict: a host id at most once, every line well formed.
pub fn parse_peers(text: &str) -> Result<Vec<(u16, SocketAddr)>, String> {
    let mut out: Vec<(u16, SocketAddr)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(id), Some(addr), None) = (it.next(), it.next(), it.next()) else {
            return Err(format!("line {}: expected `HOST_ID ADDR:PORT`", i + 1));
        };
        let id: u16 = id.parse().map_err(|_| format!("line {}: host id {id:?} is not 0..=65535", i + 1))?;
        let addr: SocketAddr = addr.parse().map_err(|_| format!("line {}: {addr:?} is not ADDR:PORT", i + 1))?;
        if out.iter().any(|(h, _)| *h == id) {
            return Err(format!("line {}: host id {id} given twice", i + 1));
        }
        out.push((id, addr));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_peers;

    #[test]
    fn peers_files_parse_strictly() {
        let ok = parse_peers("# cluster\n1 198.18.2.2:4434\n\n2 [2001:db8::2]:4434 # b\n").expect("valid");
        assert_eq!(ok, vec![(1, "198.18.2.2:4434".parse().unwrap()), (2, "[2001:db8::2]:4434".parse().unwrap())]);
        for (bad, why) in [
            ("1 198.18.2.2:4434\n1 198.18.2.3:4434", "line 2: host id 1 given twice"),
            ("1", "line 1: expected"),
            ("1 198.18.2.2:4434 extra", "line 1: expected"),
            ("x 198.18.2.2:4434", "line 1: host id \"x\""),
            ("70000 198.18.2.2:4434", "line 1: host id \"70000\""),
            ("1 198.18.2.2", "line 1: \"198.18.2.2\" is not ADDR:PORT"),
        ] {
            let e = parse_peers(bad).expect_err(bad);
            assert!(e.starts_with(why), "{bad:?}: {e}");
        }
    }
}
