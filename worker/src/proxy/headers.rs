//! The reverse proxy's header mapping: an HTTP/3 request head to the upstream's
//! HTTP/1.1 or HTTP/2 request head, and the upstream's response head back. Pure
//! functions (no I/O), so that a property test can hold them against a model.
//!
//! - RFC 9114 §4.3.1: the pseudo-header fields become the request line (method,
//!   path) and `Host` (from `:authority`, else the `Host` field; both present must
//!   agree). The authority is kept: it is the `Host` an HTTP/1.1 upstream sees and
//!   the `:authority` an HTTP/2 upstream sees (RFC 9113 §8.3.1: no `Host` there).
//! - RFC 9110 §7.6.1: hop-by-hop fields are not forwarded: `Connection` and every
//!   field it names, `Keep-Alive`, `Proxy-Connection`, `TE` (except `TE: trailers`
//!   towards an HTTP/2 upstream, RFC 9113 §8.2.2), `Transfer-Encoding`, `Upgrade`.
//!   The same fields are dropped from responses: HTTP/3 forbids them (RFC 9114 §4.2).
//! - RFC 7239: a `Forwarded: for=…;proto=https;host=…` element is appended after any
//!   the client sent (so the last element is this proxy's), and, when asked,
//!   `X-Forwarded-For` (appended) and `X-Forwarded-Proto: https` (replaced).

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, TE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Uri};
use std::net::{IpAddr, SocketAddr};

/// The upstream's HTTP version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (`http://`).
    Http1,
    /// HTTP/2 over cleartext TCP with prior knowledge (`h2c://`, RFC 9113 §3.3).
    H2c,
}

/// Why a request cannot be forwarded (answered 400, or 501 for CONNECT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapError {
    /// Neither `:authority` nor `Host` (RFC 9114 §4.3.1).
    NoAuthority,
    /// `:authority` and `Host` differ, or `Host` is not an authority.
    BadHost,
    /// CONNECT (RFC 9114 §4.4) is not proxied.
    Connect,
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MapError::NoAuthority => "the request has neither :authority nor Host",
            MapError::BadHost => "Host is not an authority or differs from :authority",
            MapError::Connect => "CONNECT is not proxied",
        })
    }
}

/// What the proxy adds besides `Forwarded`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardOptions {
    /// Also `X-Forwarded-For` and `X-Forwarded-Proto`.
    pub x_forwarded: bool,
}

/// The upstream request head: method as received, `uri` = `http://AUTHORITY/PATH`
/// (the client's authority; the connector dials the upstream whatever it says), and
/// the forwarded fields.
#[derive(Clone, Debug)]
pub struct UpstreamHead {
    pub method: Method,
    pub uri: Uri,
    pub authority: Authority,
    pub headers: HeaderMap,
}

/// Fields that never cross a proxy (RFC 9110 §7.6.1), besides those `Connection` names.
pub const HOP_BY_HOP: [&str; 6] =
    ["connection", "keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade"];

/// Field names listed in every `Connection` field of `headers`, lowercase.
fn connection_tokens(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// `true` if `v` is exactly the `trailers` TE member (RFC 9110 §10.1.4), the one TE
/// value HTTP/2 allows (RFC 9113 §8.2.2).
fn te_is_trailers(v: &HeaderValue) -> bool {
    v.to_str().is_ok_and(|s| s.split(',').all(|t| t.trim().eq_ignore_ascii_case("trailers")))
}

/// `headers` without the hop-by-hop fields; `keep_te_trailers` keeps `TE: trailers`.
pub fn end_to_end(headers: &HeaderMap, keep_te_trailers: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    end_to_end_into(headers, keep_te_trailers, false, &mut out);
    out
}

/// [`end_to_end`] appended to `out`; `drop_host` leaves `Host` out too.
fn end_to_end_into(headers: &HeaderMap, keep_te_trailers: bool, drop_host: bool, out: &mut HeaderMap) {
    let named = connection_tokens(headers);
    for (name, value) in headers {
        if drop_host && name == HOST {
            continue;
        }
        let n = name.as_str();
        if named.iter().any(|t| t == n) {
            continue;
        }
        if name == TE {
            if keep_te_trailers && te_is_trailers(value) {
                out.append(name.clone(), value.clone());
            }
            continue;
        }
        if HOP_BY_HOP.contains(&n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
}

/// The client's IP as forwarded: an IPv4-mapped IPv6 address (a dual-stack socket)
/// as the IPv4 address it stands for.
pub fn client_ip(client: SocketAddr) -> IpAddr {
    client.ip().to_canonical()
}

/// RFC 7230 `tchar` (RFC 9110 §5.6.2).
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A `Forwarded` parameter value: a token as is, anything else as a quoted-string
/// (RFC 7239 §4, RFC 9110 §5.6.4).
fn token_or_quoted(v: &str) -> String {
    if !v.is_empty() && v.chars().all(is_tchar) {
        return v.to_string();
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// Appends `a` in dotted-decimal form (what `Ipv4Addr`'s `Display` writes, without
/// the formatting machinery: this runs once per request).
fn push_ipv4(s: &mut String, a: std::net::Ipv4Addr) {
    for (i, o) in a.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if o >= 100 {
            s.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            s.push(char::from(b'0' + o / 10 % 10));
        }
        s.push(char::from(b'0' + o % 10));
    }
}

/// One `Forwarded` element (RFC 7239 §4): `for=` the client's IP (RFC 7239 §6: an
/// IPv6 address in brackets, quoted), `proto=https`, `host=` the authority.
pub fn forwarded_element(client: SocketAddr, authority: &str) -> String {
    let mut s = String::with_capacity(40 + authority.len());
    s.push_str("for=");
    match client_ip(client) {
        IpAddr::V4(a) => push_ipv4(&mut s, a),
        IpAddr::V6(a) => {
            use std::fmt::Write;
            let _ = write!(s, "\"[{a}]\"");
        }
    }
    s.push_str(";proto=https;host=");
    if !authority.is_empty() && authority.chars().all(is_tchar) {
        s.push_str(authority);
    } else {
        s.push_str(&token_or_quoted(authority));
    }
    s
}

/// Maps an HTTP/3 request head (RFC 9114 §4.3.1) to the upstream's.
pub fn map_request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    client: SocketAddr,
    protocol: Protocol,
    opts: ForwardOptions,
) -> Result<UpstreamHead, MapError> {
    if method == Method::CONNECT {
        return Err(MapError::Connect);
    }
    let host = match headers.get(HOST) {
        Some(h) => Some(h.to_str().ok().and_then(|s| s.parse::<Authority>().ok()).ok_or(MapError::BadHost)?),
        None => None,
    };
    let authority = match (uri.authority(), host) {
        (Some(a), Some(h)) if a.as_str() != h.as_str() => return Err(MapError::BadHost),
        (Some(a), _) => a.clone(),
        (None, Some(h)) => h,
        (None, None) => return Err(MapError::NoAuthority),
    };
    let path = uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|_| MapError::BadHost)?;
    let mut out = HeaderMap::with_capacity(headers.len() + 4);
    if protocol == Protocol::Http1 {
        // RFC 9112 §3.2: Host first; HTTP/2 carries it as :authority (from `uri`).
        out.insert(HOST, HeaderValue::from_str(authority.as_str()).map_err(|_| MapError::BadHost)?);
    }
    end_to_end_into(headers, protocol == Protocol::H2c, true, &mut out);
    let fwd = forwarded_element(client, authority.as_str());
    out.append(HeaderName::from_static("forwarded"), HeaderValue::try_from(fwd).map_err(|_| MapError::BadHost)?);
    if opts.x_forwarded {
        let xff = HeaderName::from_static("x-forwarded-for");
        let ip = client_ip(client).to_string();
        let prior: Vec<&str> = out.get_all(&xff).iter().filter_map(|v| v.to_str().ok()).collect();
        let joined = if prior.is_empty() { ip } else { format!("{}, {ip}", prior.join(", ")) };
        let v = HeaderValue::from_str(&joined).map_err(|_| MapError::BadHost)?;
        out.insert(xff, v);
        out.insert(HeaderName::from_static("x-forwarded-proto"), HeaderValue::from_static("https"));
    }
    Ok(UpstreamHead { method: method.clone(), uri, authority, headers: out })
}

/// The upstream's response fields as the HTTP/3 response carries them (RFC 9114
/// §4.2: no connection-specific fields, `TE` included).
pub fn map_response(headers: &HeaderMap) -> HeaderMap {
    end_to_end(headers, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn pairs(h: &HeaderMap) -> Vec<(String, String)> {
        h.iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())).collect()
    }

    fn get(uri: &str) -> (Method, Uri) {
        (Method::GET, uri.parse().unwrap())
    }

    #[test]
    fn http1_gets_host_first_and_forwarded_last() {
        let (m, u) = get("https://example.com:4433/a/b?c=d");
        let h = hm(&[("accept", "*/*"), ("x-a", "1"), ("x-a", "2")]);
        let out = map_request(&m, &u, &h, addr("192.0.2.7:5555"), Protocol::Http1, ForwardOptions::default()).unwrap();
        assert_eq!(out.uri.to_string(), "http://example.com:4433/a/b?c=d");
        assert_eq!(out.authority.as_str(), "example.com:4433");
        assert_eq!(
            pairs(&out.headers),
            [
                ("host", "example.com:4433"),
                ("accept", "*/*"),
                ("x-a", "1"),
                ("x-a", "2"),
                ("forwarded", "for=192.0.2.7;proto=https;host=\"example.com:4433\""),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }

    #[test]
    fn h2c_carries_the_authority_not_host_and_keeps_te_trailers() {
        let (m, u) = get("https://example.com/");
        let h = hm(&[("te", "trailers"), ("host", "example.com")]);
        let out = map_request(&m, &u, &h, addr("[2001:db8::1]:9"), Protocol::H2c, ForwardOptions::default()).unwrap();
        assert_eq!(out.uri.authority().unwrap().as_str(), "example.com");
        assert!(out.headers.get(HOST).is_none());
        assert_eq!(out.headers.get(TE).unwrap(), "trailers");
        assert_eq!(out.headers.get("forwarded").unwrap(), "for=\"[2001:db8::1]\";proto=https;host=example.com");
        // Towards HTTP/1.1, TE goes (hop-by-hop), trailers or not.
        let out = map_request(&m, &u, &h, addr("[::1]:9"), Protocol::Http1, ForwardOptions::default()).unwrap();
        assert!(out.headers.get(TE).is_none());
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_are_dropped() {
        let (m, u) = get("https://h/");
        let h = hm(&[
            ("connection", "close, X-Secret"),
            ("connection", "x-other"),
            ("x-secret", "s"),
            ("x-other", "o"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "gzip, trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-kept", "k"),
        ]);
        let out = map_request(&m, &u, &h, addr("127.0.0.1:1"), Protocol::H2c, ForwardOptions::default()).unwrap();
        let names: Vec<String> = out.headers.keys().map(|k| k.to_string()).collect();
        assert_eq!(names, ["x-kept", "forwarded"]);
    }

    #[test]
    fn authority_and_host_rules() {
        let c = addr("127.0.0.1:1");
        let o = ForwardOptions::default();
        // Host alone stands for :authority.
        let out =
            map_request(&Method::GET, &"/p".parse().unwrap(), &hm(&[("host", "h:81")]), c, Protocol::Http1, o).unwrap();
        assert_eq!(out.uri.to_string(), "http://h:81/p");
        assert_eq!(out.headers.get(HOST).unwrap(), "h:81");
        // Both, equal: fine; different: malformed (RFC 9114 §4.3.1).
        let u: Uri = "https://h:81/p".parse().unwrap();
        assert!(map_request(&Method::GET, &u, &hm(&[("host", "h:81")]), c, Protocol::Http1, o).is_ok());
        assert_eq!(
            map_request(&Method::GET, &u, &hm(&[("host", "evil")]), c, Protocol::Http1, o).unwrap_err(),
            MapError::BadHost
        );
        assert_eq!(
            map_request(&Method::GET, &"/p".parse().unwrap(), &HeaderMap::new(), c, Protocol::Http1, o).unwrap_err(),
            MapError::NoAuthority
        );
        assert_eq!(
            map_request(&Method::CONNECT, &u, &HeaderMap::new(), c, Protocol::Http1, o).unwrap_err(),
            MapError::Connect
        );
    }

    #[test]
    fn x_forwarded_appends_for_and_replaces_proto() {
        let (m, u) = get("https://h/");
        let h = hm(&[("x-forwarded-for", "198.51.100.1"), ("x-forwarded-proto", "http"), ("forwarded", "for=x")]);
        let o = ForwardOptions { x_forwarded: true };
        let out = map_request(&m, &u, &h, addr("[::ffff:192.0.2.9]:7"), Protocol::Http1, o).unwrap();
        assert_eq!(out.headers.get("x-forwarded-for").unwrap(), "198.51.100.1, 192.0.2.9");
        assert_eq!(out.headers.get("x-forwarded-proto").unwrap(), "https");
        let fwd: Vec<_> = out.headers.get_all("forwarded").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(fwd, ["for=x", "for=192.0.2.9;proto=https;host=h"]);
        // Off: neither is added (the client's own pass through).
        let out =
            map_request(&m, &u, &HeaderMap::new(), addr("127.0.0.1:7"), Protocol::Http1, ForwardOptions::default())
                .unwrap();
        assert!(out.headers.get("x-forwarded-for").is_none() && out.headers.get("x-forwarded-proto").is_none());
    }

    #[test]
    fn responses_lose_connection_specific_fields() {
        let h = hm(&[
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-type", "text/plain"),
            ("te", "trailers"),
        ]);
        assert_eq!(pairs(&map_response(&h)), [("content-type".to_string(), "text/plain".to_string())]);
    }

    proptest! {
        /// The hand-written dotted decimal is `Ipv4Addr`'s `Display`.
        #[test]
        fn ipv4_as_display(a in any::<u32>()) {
            let a = std::net::Ipv4Addr::from(a);
            let mut s = String::new();
            push_ipv4(&mut s, a);
            prop_assert_eq!(s, a.to_string());
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(token_or_quoted("a.b-c"), "a.b-c");
        assert_eq!(token_or_quoted("[::1]:443"), "\"[::1]:443\"");
        assert_eq!(token_or_quoted("a\"b\\"), "\"a\\\"b\\\\\"");
        assert_eq!(token_or_quoted(""), "\"\"");
    }

    /// Names a generated request draws from: hop-by-hop ones, ones a Connection field
    /// may name, and plain ones.
    const NAMES: [&str; 10] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
        "x-a",
        "x-b",
        "accept",
        "forwarded",
    ];
    const VALUES: [&str; 6] = ["trailers", "x-a", "x-b, accept", "close", "v", "gzip"];

    proptest! {
        /// Model: a field crosses iff its name is not hop-by-hop, not named by a
        /// Connection value, and not Host; TE crosses only as `trailers` to HTTP/2.
        /// Order of the rest is kept; Host comes first (HTTP/1.1) and Forwarded last.
        #[test]
        fn mapping_matches_the_model(
            fields in proptest::collection::vec((0..NAMES.len(), 0..VALUES.len()), 0..12),
            h2 in any::<bool>(),
            v6 in any::<bool>(),
            xf in any::<bool>(),
        ) {
            let input: Vec<(&str, &str)> = fields.iter().map(|&(n, v)| (NAMES[n], VALUES[v])).collect();
            let h = hm(&input);
            let client = if v6 { addr("[2001:db8::5]:1") } else { addr("203.0.113.5:1") };
            let protocol = if h2 { Protocol::H2c } else { Protocol::Http1 };
            let out = map_request(&Method::POST, &"https://app.test/x".parse().unwrap(), &h, client, protocol,
                ForwardOptions { x_forwarded: xf }).unwrap();

            let named: Vec<String> = input.iter().filter(|(n, _)| *n == "connection")
                .flat_map(|(_, v)| v.split(',').map(|t| t.trim().to_string())).collect();
            let mut want: Vec<(String, String)> = Vec::new();
            if !h2 { want.push(("host".into(), "app.test".into())); }
            // A HeaderMap lists a name's values together, at the name's first place.
            fn group<T: Clone + PartialEq<T>>(v: &[(T, T)]) -> Vec<(T, T)> {
                let mut g: Vec<(T, T)> = Vec::new();
                for (n, _) in v {
                    if !g.iter().any(|(m, _)| m == n) {
                        g.extend(v.iter().filter(|(m, _)| m == n).cloned());
                    }
                }
                g
            }
            for (n, v) in &group(&input) {
                let hop = HOP_BY_HOP.contains(n) || named.iter().any(|t| t == n);
                let te_ok = *n == "te" && h2 && *v == "trailers" && !named.iter().any(|t| t == "te");
                if !hop || te_ok { want.push((n.to_string(), v.to_string())); }
            }
            let ip = if v6 { "\"[2001:db8::5]\"" } else { "203.0.113.5" };
            want.push(("forwarded".into(), format!("for={ip};proto=https;host=app.test")));
            if xf {
                let xff = if v6 { "2001:db8::5" } else { "203.0.113.5" };
                want.push(("x-forwarded-for".into(), xff.into()));
                want.push(("x-forwarded-proto".into(), "https".into()));
            }
            let grouped = group(&want);
            let got = pairs(&out.headers);
            prop_assert_eq!(&got, &grouped);
            let last_fwd = out.headers.get_all("forwarded").iter().next_back().map(|v| v.to_str().unwrap().to_string());
            prop_assert_eq!(last_fwd, Some(format!("for={ip};proto=https;host=app.test")));
            if !h2 { prop_assert_eq!(got.first().map(|p| p.0.as_str()), Some("host")); }
        }
    }
}
