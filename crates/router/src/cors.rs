//! Which web pages may call the API from a browser (CORS). By default only pages served from
//! this machine (`http(s)://localhost`, `127.0.0.0/8`, `[::1]`, any port): a page elsewhere must
//! not be able to use a server that trusts loopback, even with no key set. `--cors-origins` names
//! exact origins, or `*` for any. Preflights (`OPTIONS`) are answered before authentication, as
//! browsers send them without credentials.

use axum::http::{header, HeaderName, HeaderValue, Method};
use std::net::IpAddr;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The origins allowed to call the API from a browser.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CorsOrigins {
    /// Pages served from this machine.
    #[default]
    Loopback,
    /// Any page (`*`).
    Any,
    /// These origins exactly (`https://app.example.com`, `http://10.0.0.5:3000`).
    Exact(Vec<String>),
}

impl CorsOrigins {
    /// From `--cors-origins` values: none means loopback; `*` alone means any; otherwise each
    /// must be an origin, `scheme://host[:port]` with nothing after it.
    pub fn parse(values: &[String]) -> Result<CorsOrigins, String> {
        let values: Vec<&str> = values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()).collect();
        match values.as_slice() {
            [] => Ok(CorsOrigins::Loopback),
            ["*"] => Ok(CorsOrigins::Any),
            _ if values.contains(&"*") => Err("`*` allows every origin: give it alone".into()),
            _ => values
                .iter()
                .map(|v| match origin_host(v) {
                    Some(_) => Ok(v.trim_end_matches('/').to_ascii_lowercase()),
                    None => Err(format!("`{v}` is not an origin (scheme://host[:port], e.g. https://app.example.com)")),
                })
                .collect::<Result<_, _>>()
                .map(CorsOrigins::Exact),
        }
    }

    /// The layer answering preflights and adding `Access-Control-*` headers to answers.
    pub fn layer(&self) -> CorsLayer {
        let allow = match self {
            CorsOrigins::Any => AllowOrigin::any(),
            CorsOrigins::Loopback => AllowOrigin::predicate(|origin, _| origin.to_str().is_ok_and(is_loopback_origin)),
            CorsOrigins::Exact(list) => {
                let list: Vec<HeaderValue> = list.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
                AllowOrigin::list(list)
            }
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            // SDKs send headers of their own (`x-stainless-*`, `openai-beta`): whatever a
            // preflight asks for is allowed; the key is checked on the request itself.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([HeaderName::from_static("x-request-id"), header::RETRY_AFTER])
            .max_age(std::time::Duration::from_secs(600))
    }
}

/// The host of an origin `scheme://host[:port]` (http or https, no path), lower-cased.
fn origin_host(origin: &str) -> Option<String> {
    let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let host = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        format!("[{host}]")
    } else {
        let (host, port) = rest.split_once(':').map_or((rest, None), |(h, p)| (h, Some(p)));
        if host.is_empty() || port.is_some_and(|p| !valid_port(p)) {
            return None;
        }
        host.to_owned()
    };
    Some(host.to_ascii_lowercase())
}

fn valid_port(p: &str) -> bool {
    p.parse::<u16>().is_ok()
}

fn is_loopback_origin(origin: &str) -> bool {
    match origin_host(origin) {
        Some(host) if host == "localhost" || host.ends_with(".localhost") => true,
        Some(host) => {
            host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_are_this_machines_pages_only() {
        for o in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
            "http://127.1.2.3:5173",
            "http://app.localhost",
        ] {
            assert!(is_loopback_origin(o), "{o}");
        }
        for o in [
            "http://evil.example",
            "http://localhost.evil.example",
            "null",
            "file://",
            "http://10.0.0.1",
            "http://127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_origin(o), "{o}");
        }
    }

    #[test]
    fn origins_are_parsed_and_bad_ones_named() {
        assert_eq!(CorsOrigins::parse(&[]), Ok(CorsOrigins::Loopback));
        assert_eq!(CorsOrigins::parse(&["*".into()]), Ok(CorsOrigins::Any));
        assert_eq!(
            CorsOrigins::parse(&["https://App.example.com/".into(), "http://10.0.0.5:3000".into()]),
            Ok(CorsOrigins::Exact(vec!["https://app.example.com".into(), "http://10.0.0.5:3000".into()]))
        );
        for bad in ["app.example.com", "https://app.example.com/path", "ftp://x", "http://x:99999", "*,https://a.b"] {
            let values: Vec<String> = bad.split(',').map(str::to_owned).collect();
            let err = CorsOrigins::parse(&values).unwrap_err();
            assert!(err.contains('`'), "{bad}: {err}");
        }
    }
}
