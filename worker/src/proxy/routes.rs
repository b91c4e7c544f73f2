//! `--upstream [AUTHORITY][/PREFIX]=URL`: which upstream a request goes to, by its
//! `:authority` host and the longest path prefix that matches it. Pure.
//!
//! A route names a host (case-insensitive; any port, RFC 9110 §4.2.3: the port is
//! not compared) or none (any host), and a path prefix matched on segment
//! boundaries (`/api` matches `/api` and `/api/x`, not `/apix`; no prefix matches
//! every path). A route with a host beats one without; then the longer prefix wins;
//! then the route given first.

use super::upstream::{parse_upstream, Upstream};

/// One `--upstream` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The host, lower case, without a port; `None`: any host.
    pub host: Option<String>,
    /// `""` (every path) or `/SEGMENT[/SEGMENT…]` without a trailing `/`.
    pub prefix: String,
    pub upstream: Upstream,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}={}", self.host.as_deref().unwrap_or(""), self.prefix, self.upstream)
    }
}

/// Parses `URL` (the default route) or `[AUTHORITY][/PREFIX]=URL`.
pub fn parse_route(s: &str) -> Result<Route, String> {
    let (target, url) = match s.split_once('=') {
        Some((t, u)) => (t, u),
        None => ("", s),
    };
    let upstream = parse_upstream(url)?;
    let (authority, prefix) = match target.find('/') {
        Some(i) => target.split_at(i),
        None => (target, ""),
    };
    let prefix = prefix.trim_end_matches('/');
    if prefix.contains(['?', '#', '*', ' ']) || prefix.contains("//") {
        return Err(format!("{s:?}: the path prefix must be /SEGMENT[/SEGMENT...] (no query, no empty segment)"));
    }
    let host = if authority.is_empty() {
        None
    } else {
        let a: http::uri::Authority = authority.parse().map_err(|e| format!("{s:?}: host {authority:?}: {e}"))?;
        if a.as_str().contains('@') {
            return Err(format!("{s:?}: host {authority:?}: no user part"));
        }
        Some(a.host().to_ascii_lowercase())
    };
    Ok(Route { host, prefix: prefix.to_string(), upstream })
}

/// The host of an `:authority` (`host`, `host:port`, `[v6]:port`), lower case.
pub fn host_of(authority: &str) -> String {
    let host = match authority.parse::<http::uri::Authority>() {
        Ok(a) => a.host().to_string(),
        Err(_) => authority.to_string(),
    };
    host.to_ascii_lowercase()
}

/// Whether `prefix` matches `path` on a segment boundary.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.is_empty() || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The routes, tried most specific first.
#[derive(Clone, Debug)]
pub struct RouteTable {
    routes: Vec<Route>,
    /// Indices into `routes`: with a host first, then by prefix length (longest
    /// first), then as given. The first that matches wins.
    order: Vec<usize>,
}

impl RouteTable {
    pub fn new(routes: Vec<Route>) -> RouteTable {
        let mut order: Vec<usize> = (0..routes.len()).collect();
        // Stable: equal keys keep the order given.
        order.sort_by_key(|&i| (routes[i].host.is_none(), std::cmp::Reverse(routes[i].prefix.len())));
        RouteTable { routes, order }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Whether any route names a host (else the request's host is not needed).
    pub fn by_host(&self) -> bool {
        self.routes.iter().any(|r| r.host.is_some())
    }

    /// The index of the route for a request to `host` (lower case, no port; see
    /// [`host_of`]) and `path` (without the query), if any.
    pub fn choose(&self, host: &str, path: &str) -> Option<usize> {
        self.order.iter().copied().find(|&i| {
            let r = &self.routes[i];
            r.host.as_deref().is_none_or(|h| h == host) && prefix_matches(&r.prefix, path)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(specs: &[&str]) -> RouteTable {
        RouteTable::new(specs.iter().map(|s| parse_route(s).unwrap()).collect())
    }

    #[test]
    fn parses_routes() {
        let r = parse_route("http://127.0.0.1:8080").unwrap();
        assert_eq!((r.host, r.prefix.as_str()), (None, ""));
        let r = parse_route("Api.Example:443/v1/=h2c://10.0.0.1:81").unwrap();
        assert_eq!((r.host.as_deref(), r.prefix.as_str()), (Some("api.example"), "/v1"));
        assert_eq!(r.upstream.to_string(), "h2c://10.0.0.1:81");
        let r = parse_route("/static=http://a").unwrap();
        assert_eq!((r.host, r.prefix.as_str()), (None, "/static"));
        let r = parse_route("[::1]:8443=http://a").unwrap();
        assert_eq!(r.host.as_deref(), Some("[::1]"));
        assert_eq!(parse_route("/=http://a").unwrap().prefix, "");
        for bad in
            ["/a=ftp://x", "/a?b=http://x", "/a//b=http://x", "u@h=http://x", "a b=http://x", "=", "h=http://x/p"]
        {
            assert!(parse_route(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn segment_boundaries() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(!prefix_matches("/api", "/"));
        assert!(prefix_matches("", "/anything"));
        assert!(prefix_matches("", "*"));
    }

    #[test]
    fn host_then_longest_prefix_then_first() {
        let t = table(&[
            "http://a:1",
            "/api=http://b:1",
            "/api/v2=http://c:1",
            "site.example=http://d:1",
            "site.example/api=http://e:1",
            "/api=http://f:1",
        ]);
        assert_eq!(t.choose("localhost", "/x"), Some(0));
        assert_eq!(t.choose("localhost", "/api"), Some(1));
        assert_eq!(t.choose("localhost", "/apix"), Some(0));
        assert_eq!(t.choose("localhost", "/api/v2/z"), Some(2));
        assert_eq!(t.choose("site.example", "/api/v2/z"), Some(4));
        assert_eq!(t.choose("site.example", "/other"), Some(3));
        assert_eq!(host_of("SITE.example:443"), "site.example");
        assert_eq!(host_of("[::1]:443"), "[::1]");
        let no_default = table(&["site.example=http://d:1", "/api=http://b:1"]);
        assert_eq!(no_default.choose("other", "/x"), None);
        assert_eq!(no_default.choose("other", "/api/x"), Some(1));
    }

    /// The model: every matching route scored (has a host, prefix length), the
    /// highest score given first.
    fn model(routes: &[Route], host: &str, path: &str) -> Option<usize> {
        let mut best: Option<(usize, (bool, usize))> = None;
        for (i, r) in routes.iter().enumerate() {
            let host_ok = match &r.host {
                None => true,
                Some(h) => h == host,
            };
            let path_ok = r.prefix.is_empty()
                || path == r.prefix
                || (path.len() > r.prefix.len()
                    && path.starts_with(&r.prefix)
                    && path.as_bytes()[r.prefix.len()] == b'/');
            if host_ok && path_ok {
                let score = (r.host.is_some(), r.prefix.len());
                if best.is_none_or(|(_, s)| score > s) {
                    best = Some((i, score));
                }
            }
        }
        best.map(|(i, _)| i)
    }

    fn segs() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof![Just("a"), Just("ab"), Just("b"), Just("")], 0..4)
            .prop_map(|v| v.iter().filter(|s| !s.is_empty()).map(|s| format!("/{s}")).collect())
    }

    proptest! {
        #[test]
        fn choose_matches_the_model(
            specs in proptest::collection::vec((prop_oneof![Just(""), Just("x.example"), Just("y.example")], segs()), 0..8),
            host in prop_oneof![Just("x.example"), Just("y.example"), Just("z.example")],
            path in segs(),
            tail in prop_oneof![Just(""), Just("/"), Just("b"), Just("/c")],
        ) {
            let routes: Vec<Route> = specs
                .iter()
                .enumerate()
                .map(|(i, (h, p))| parse_route(&format!("{h}{p}=http://u{i}:1")).unwrap())
                .collect();
            let path = format!("{path}{tail}");
            let t = RouteTable::new(routes.clone());
            prop_assert_eq!(t.choose(host, &path), model(&routes, host, &path));
        }
    }
}
