//! A web page the user visits must not be able to drive the local server: JSON routes
//! take `application/json` only (a `text/plain` POST needs no preflight), the `Host`
//! must name the server (DNS rebinding), and only the origins given by `cors_origins`
//! get CORS answers; preflights need no key. Raw HTTP on a loopback port, as a browser
//! or an attacker's page would send it.

use crate::common;

use common::*;
use serde_json::Value;

const COMPLETION: &str = r#"{"prompt":"hi","max_tokens":2,"temperature":0}"#;

fn post_with(addr: std::net::SocketAddr, path: &str, headers: &str, body: &str) -> String {
    raw(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}content-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn error_of(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON error body in {answer}"))
}

#[test]
fn json_routes_refuse_other_content_types_with_415() {
    let s = tiny_server(1, |_| {});
    let addr = s.running.addr();
    for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"] {
        for ct in [
            "content-type: text/plain\r\n",
            "content-type: application/x-www-form-urlencoded\r\n",
            "",
        ] {
            let a = post_with(addr, path, ct, COMPLETION);
            assert!(a.starts_with("HTTP/1.1 415"), "{path} {ct:?}: {a}");
            let v = error_of(&a);
            // llama-server's paths answer its shape, the status as a number in `code`.
            let code = if path == "/tokenize" {
                Value::from(415)
            } else {
                Value::Null
            };
            assert_eq!(v["error"]["code"], code, "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("application/json"), "{msg}");
        }
    }
    let ok = post_with(
        addr,
        "/v1/completions",
        "content-type: application/json; charset=utf-8\r\n",
        COMPLETION,
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
}

#[test]
fn a_host_that_does_not_name_the_server_is_refused() {
    let s = tiny_server(1, |_| {});
    let addr = s.running.addr();
    let port = addr.port();
    let get = |host: &str| {
        raw(
            addr,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nconnection: close\r\n\r\n"),
        )
    };
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let a = get(&host);
        assert!(a.starts_with("HTTP/1.1 200"), "{host}: {a}");
    }
    // A DNS-rebinding page reaches 127.0.0.1 under its own name.
    for host in [format!("evil.example:{port}"), "localhost:1".to_string()] {
        let a = get(&host);
        assert!(a.starts_with("HTTP/1.1 403"), "{host}: {a}");
        let msg = error_of(&a)["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains(&host) && msg.contains("--allowed-hosts"),
            "{msg}"
        );
    }
    // The same refusal reaches generation, and /health too.
    let a = raw(
        addr,
        &format!(
            "POST /v1/completions HTTP/1.1\r\nHost: evil.example:{port}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{COMPLETION}",
            COMPLETION.len()
        ),
    );
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
    let a = raw(
        addr,
        &format!("GET /health HTTP/1.1\r\nHost: evil.example:{port}\r\nconnection: close\r\n\r\n"),
    );
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");

    let named = tiny_server(1, |c| c.allowed_hosts = vec!["box.lan".into()]);
    let a = raw(
        named.running.addr(),
        "GET /v1/models HTTP/1.1\r\nHost: box.lan:8080\r\nconnection: close\r\n\r\n",
    );
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
}

#[test]
fn cors_answers_allowed_origins_only_and_preflights_need_no_key() {
    let app = "http://app.local:3000";
    let s = tiny_server(1, |c| {
        c.api_key = Some("sekret".into());
        c.cors_origins = vec![app.into()];
    });
    let addr = s.running.addr();
    let preflight = |origin: &str| {
        raw(
            addr,
            &format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n\
                 connection: close\r\n\r\n"
            ),
        )
    };
    let a = preflight(app);
    assert!(a.starts_with("HTTP/1.1 204"), "{a}");
    assert_eq!(
        raw_header(&a, "access-control-allow-origin").as_deref(),
        Some(app)
    );
    let methods = raw_header(&a, "access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("POST"), "{a}");
    let allowed = raw_header(&a, "access-control-allow-headers").unwrap_or_default();
    assert!(
        allowed.contains("authorization") && allowed.contains("x-stainless-os"),
        "{a}"
    );
    assert!(
        raw_header(&a, "vary")
            .unwrap_or_default()
            .contains("origin"),
        "{a}"
    );

    let evil = "https://evil.example";
    let a = preflight(evil);
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
    assert_eq!(raw_header(&a, "access-control-allow-origin"), None, "{a}");

    // The real request from the allowed origin, with the key, gets the CORS headers.
    let a = post_with(
        addr,
        "/v1/completions",
        &format!(
            "origin: {app}\r\nauthorization: Bearer sekret\r\ncontent-type: application/json\r\n"
        ),
        COMPLETION,
    );
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(
        raw_header(&a, "access-control-allow-origin").as_deref(),
        Some(app)
    );
    // A page of another origin is refused even for requests a browser sends unasked.
    let a = post_with(
        addr,
        "/v1/completions",
        &format!(
            "origin: {evil}\r\nauthorization: Bearer sekret\r\ncontent-type: application/json\r\n"
        ),
        COMPLETION,
    );
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
    assert_eq!(raw_header(&a, "access-control-allow-origin"), None, "{a}");
    let msg = error_of(&a)["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains(evil) && msg.contains("--cors-origins"),
        "{msg}"
    );
    // Non-browser clients (no Origin) and the server's own origin are unaffected.
    let a = post_with(
        addr,
        "/v1/completions",
        &format!("origin: http://{addr}\r\nauthorization: Bearer sekret\r\ncontent-type: application/json\r\n"),
        COMPLETION,
    );
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(raw_header(&a, "access-control-allow-origin"), None, "{a}");

    // By default no other origin is allowed.
    let closed = tiny_server(1, |_| {});
    let a = raw(
        closed.running.addr(),
        &format!(
            "OPTIONS /v1/completions HTTP/1.1\r\nHost: {}\r\nOrigin: {app}\r\n\
             Access-Control-Request-Method: POST\r\nconnection: close\r\n\r\n",
            closed.running.addr()
        ),
    );
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
}
