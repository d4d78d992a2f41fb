//! What keeps a web page the user visits from driving the local server: the `Host`
//! check (against DNS rebinding), the `Origin` check with CORS for the origins the user
//! allows, and the `application/json` requirement on the JSON routes (a `text/plain` POST
//! is a CORS "simple request" that a browser sends without asking first).
//!
//! One policy for every HTTP surface minfer opens: `minfer serve` applies it in its gate
//! (with the API key and the body limits), any other surface (`minfer viz`) through
//! [`guard`], with the same flags and defaults.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Names the `Host` header may carry, and the origins allowed to call the server.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `None`: any `Host` is accepted (bound to a non-loopback address, no list given).
    hosts: Option<Vec<HostName>>,
    /// Origins allowed besides the server's own; `"*"` allows every origin.
    origins: Vec<String>,
    /// `localhost` was listed: any loopback origin (`localhost`, `127.0.0.1`, `[::1]`)
    /// on any port, llama-server's keyword for a local web UI on its own dev server.
    loopback_origins: bool,
}

/// One accepted `Host`: a lower-case name and, when given, the only port accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostName {
    name: String,
    port: Option<u16>,
}

/// Splits `name[:port]` (IPv6 literals in brackets) into a lower-case name and a port;
/// `None` when the port is not a number.
fn split_host(s: &str) -> Option<(String, Option<u16>)> {
    let s = s.trim();
    let (name, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let (name, rest) = s.split_at(end + 1);
        match rest.strip_prefix(':') {
            Some(p) => (name, Some(p)),
            None if rest.is_empty() => (name, None),
            None => return None,
        }
    } else {
        match s.rsplit_once(':') {
            Some((name, p)) => (name, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    // A fully qualified name may end in a dot; it is the same name.
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some((name, port))
}

impl Policy {
    /// The policy of a server bound to `bound`: on a loopback address the `Host` must be
    /// `localhost`, `127.0.0.1` or `[::1]` with the bound port, or one of
    /// `allowed_hosts` (`name` for any port, `name:port`, or `*` for any host); on other
    /// addresses the `Host` is checked only when `allowed_hosts` is given.
    /// `cors_origins` lists the origins (`scheme://host[:port]`, `localhost` for any
    /// loopback origin on any port, or `*`) that may call the server from a web page
    /// besides its own.
    pub fn new(
        bound: std::net::SocketAddr,
        allowed_hosts: &[String],
        cors_origins: &[String],
    ) -> Result<Self, String> {
        let mut names = Vec::new();
        let mut any = false;
        for h in allowed_hosts
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
        {
            if h == "*" {
                any = true;
                continue;
            }
            let (name, port) =
                split_host(h).ok_or_else(|| format!("`{h}` is not a host name[:port]"))?;
            names.push(HostName { name, port });
        }
        let hosts = if any || (!bound.ip().is_loopback() && names.is_empty()) {
            None
        } else {
            let port = Some(bound.port());
            for name in ["localhost", "127.0.0.1", "[::1]"] {
                names.push(HostName {
                    name: name.into(),
                    port,
                });
            }
            names.push(HostName {
                name: match bound.ip() {
                    std::net::IpAddr::V4(ip) => ip.to_string(),
                    std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                },
                port,
            });
            Some(names)
        };
        let mut origins = Vec::new();
        let mut loopback_origins = false;
        for o in cors_origins
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
        {
            if o.eq_ignore_ascii_case("localhost") {
                loopback_origins = true;
                continue;
            }
            if o != "*" && !(o.starts_with("http://") || o.starts_with("https://")) && o != "null" {
                return Err(format!(
                    "`{o}` is not an origin: write it as scheme://host[:port], e.g. \
                     http://localhost:3000, `localhost` (any loopback origin) or `*`"
                ));
            }
            origins.push(o.trim_end_matches('/').to_ascii_lowercase());
        }
        Ok(Policy {
            hosts,
            origins,
            loopback_origins,
        })
    }

    /// The Host check, then the Origin check (the Host comes first: a DNS-rebinding page
    /// is same-origin under its own name). `origin` is set to the allowed cross-origin
    /// caller, if any, so that even a later refusal carries the CORS headers its page
    /// needs to read it. An `OPTIONS` request is answered here: `Ok(Some(preflight))`.
    pub fn admit(
        &self,
        method: &Method,
        headers: &HeaderMap,
        origin: &mut Option<HeaderValue>,
    ) -> Result<Option<Response>, ApiError> {
        self.check_host(headers)?;
        *origin = self.check_origin(headers)?;
        if method == Method::OPTIONS {
            return Ok(Some(preflight(headers, origin.clone())));
        }
        Ok(None)
    }

    /// Refuses a request whose `Host` is not a name of this server (a DNS-rebinding
    /// page reaches a loopback server under its own name). A request without `Host`
    /// passes: browsers always send one, so its absence is no page's doing.
    pub fn check_host(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(allowed) = &self.hosts else {
            return Ok(());
        };
        let Some(raw) = headers.get(header::HOST) else {
            return Ok(());
        };
        let text = String::from_utf8_lossy(raw.as_bytes());
        let ok = split_host(&text).is_some_and(|(name, port)| {
            allowed.iter().any(|a| {
                a.name == name
                    && match a.port {
                        None => true,
                        Some(p) => port.unwrap_or(80) == p,
                    }
            })
        });
        if ok {
            return Ok(());
        }
        let names: Vec<String> = allowed
            .iter()
            .map(|a| match a.port {
                Some(p) => format!("{}:{p}", a.name),
                None => a.name.clone(),
            })
            .collect();
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the Host header `{text}` does not name this server (accepted: {}); \
                 add the name with --allowed-hosts if it is yours",
                names.join(", ")
            ),
        ))
    }

    /// The request's `Origin` when it is a cross-origin request this server allows;
    /// `Ok(None)` for no `Origin` or the server's own; an error for any other origin.
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<Option<HeaderValue>, ApiError> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(origin.as_bytes()).to_ascii_lowercase();
        let host = headers
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).to_ascii_lowercase());
        let own = host.is_some_and(|h| {
            text.strip_prefix("http://")
                .or_else(|| text.strip_prefix("https://"))
                == Some(h.as_str())
        });
        if own {
            return Ok(None);
        }
        if self.origins.iter().any(|o| o == "*") {
            return Ok(Some(HeaderValue::from_static("*")));
        }
        if self.origins.contains(&text) || (self.loopback_origins && is_loopback_origin(&text)) {
            return Ok(Some(origin.clone()));
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "cross-origin requests from `{text}` are not allowed; \
                 start the server with --cors-origins {text} to allow them"
            ),
        ))
    }
}

/// Whether a (lower-case) origin is `http(s)://` a loopback name, any port.
fn is_loopback_origin(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest.and_then(split_host)
        .is_some_and(|(name, _)| matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]"))
}

/// Adds the CORS headers for an allowed cross-origin request (`origin`), and
/// `Vary: Origin` to every answer, since the headers depend on it.
pub fn decorate(resp: &mut Response, origin: Option<HeaderValue>) {
    let h = resp.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("origin"));
    if let Some(o) = origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
    }
}

/// The answer to an `OPTIONS` request: a CORS preflight of an allowed origin gets the
/// methods and the headers it asked for; no key is needed, as browsers send none.
pub fn preflight(req_headers: &HeaderMap, origin: Option<HeaderValue>) -> Response {
    let mut resp = Response::new(axum::body::Body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let h = resp.headers_mut();
    h.insert(
        header::ALLOW,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    if origin.is_some() {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        let asked = req_headers
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    decorate(&mut resp, origin);
    resp
}

/// Middleware applying `policy` to a surface whose every POST body is JSON: the Host and
/// Origin checks, preflights, the `application/json` requirement and the CORS headers
/// (use with `axum::middleware::from_fn_with_state`).
pub async fn guard(State(policy): State<Arc<Policy>>, req: Request, next: Next) -> Response {
    let mut origin = None;
    let admitted = policy
        .admit(req.method(), req.headers(), &mut origin)
        .and_then(|pre| require_json(req.method(), req.headers()).map(|()| pre));
    let mut resp = match admitted {
        Ok(None) => next.run(req).await,
        Ok(Some(preflight)) => preflight,
        Err(e) => e.into_response(),
    };
    decorate(&mut resp, origin);
    resp
}

/// Refuses a body that is not declared `application/json` (parameters such as
/// `charset` are fine) with a 415 naming what was sent.
pub fn require_json(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if method != Method::POST {
        return Ok(());
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = ct.as_deref().map(|c| {
        c.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    if essence.as_deref() == Some("application/json") {
        return Ok(());
    }
    let got = match &ct {
        Some(c) => format!("`{c}`"),
        None => "none".to_string(),
    };
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("the request body must be sent as Content-Type: application/json (got {got})"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    fn loopback(port: u16) -> std::net::SocketAddr {
        ([127, 0, 0, 1], port).into()
    }

    #[test]
    fn loopback_accepts_local_names_on_the_bound_port_only() {
        let p = Policy::new(loopback(8080), &[], &[]).expect("policy");
        for ok in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST.:8080",
        ] {
            assert!(p.check_host(&headers(&[("host", ok)])).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost:9999",
            "localhost",
            "127.0.0.1:x",
        ] {
            let e = p.check_host(&headers(&[("host", bad)])).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
        assert!(p.check_host(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn allowed_hosts_add_names_and_star_disables_the_check() {
        let p = Policy::new(loopback(8080), &["box.lan".into(), "x.lan:81".into()], &[])
            .expect("policy");
        assert!(p.check_host(&headers(&[("host", "box.lan:1234")])).is_ok());
        assert!(p.check_host(&headers(&[("host", "x.lan:81")])).is_ok());
        assert!(p.check_host(&headers(&[("host", "x.lan:82")])).is_err());
        let any = Policy::new(loopback(8080), &["*".into()], &[]).expect("policy");
        assert!(any
            .check_host(&headers(&[("host", "evil.example")]))
            .is_ok());
        let public = Policy::new(([0, 0, 0, 0], 8080).into(), &[], &[]).expect("policy");
        assert!(public
            .check_host(&headers(&[("host", "evil.example")]))
            .is_ok());
        assert!(Policy::new(loopback(1), &["a:b".into()], &[]).is_err());
    }

    #[test]
    fn the_localhost_keyword_allows_loopback_origins_on_any_port() {
        let p = Policy::new(loopback(8080), &[], &["localhost".into()]).expect("policy");
        for ok in [
            "http://localhost:5173",
            "http://127.0.0.1:3000",
            "https://[::1]:8443",
            "http://localhost",
        ] {
            let h = headers(&[("host", "localhost:8080"), ("origin", ok)]);
            assert_eq!(
                p.check_origin(&h).expect(ok),
                Some(HeaderValue::from_str(ok).unwrap()),
                "{ok}"
            );
        }
        for bad in [
            "http://evil.example:5173",
            "http://localhost.evil.example",
            "file://localhost",
        ] {
            let h = headers(&[("host", "localhost:8080"), ("origin", bad)]);
            assert!(p.check_origin(&h).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_are_own_listed_or_refused() {
        let p =
            Policy::new(loopback(8080), &[], &["http://app.local:3000".into()]).expect("policy");
        let own = headers(&[
            ("host", "localhost:8080"),
            ("origin", "http://localhost:8080"),
        ]);
        assert_eq!(p.check_origin(&own).expect("own origin"), None);
        let listed = headers(&[
            ("host", "localhost:8080"),
            ("origin", "http://app.local:3000"),
        ]);
        assert_eq!(
            p.check_origin(&listed).expect("listed"),
            Some(HeaderValue::from_static("http://app.local:3000"))
        );
        let evil = headers(&[
            ("host", "localhost:8080"),
            ("origin", "https://evil.example"),
        ]);
        let e = p.check_origin(&evil).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert!(e.message.contains("https://evil.example"), "{}", e.message);
        let star = Policy::new(loopback(8080), &[], &["*".into()]).expect("policy");
        assert_eq!(
            star.check_origin(&evil).expect("any"),
            Some(HeaderValue::from_static("*"))
        );
        assert!(Policy::new(loopback(1), &[], &["app.local".into()]).is_err());
    }

    #[test]
    fn json_routes_take_json_only() {
        let post = Method::POST;
        assert!(require_json(&post, &headers(&[("content-type", "application/json")])).is_ok());
        assert!(require_json(
            &post,
            &headers(&[("content-type", "Application/JSON; charset=utf-8")])
        )
        .is_ok());
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            let e = require_json(&post, &headers(&[("content-type", bad)])).unwrap_err();
            assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert!(e.message.contains(bad), "{}", e.message);
        }
        assert!(require_json(&post, &HeaderMap::new()).is_err());
        assert!(require_json(&Method::GET, &HeaderMap::new()).is_ok());
    }
}
