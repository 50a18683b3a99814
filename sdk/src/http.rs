//! Outgoing HTTP through the host, for a tool an operator granted it.
//!
//! Declare the hosts in the manifest (`capabilities: {"http": [{"host": "api.example.com"}]}` in
//! [`tool!`](crate::tool)); an operator grants them with `toolsmith tools grant NAME --http
//! https://api.example.com`. The host makes the request: it checks scheme, host, port and method
//! against the grant at every redirect hop, refuses names that resolve to private addresses
//! unless granted, and bounds requests, bytes and time by the call's limits. A refusal is a
//! [`ToolError`] with code `permission_denied`; return it (`?`) and the call fails as
//! `permission_denied`, naming the capability.
//!
//! ```no_run
//! use toolsmith_sdk::{ToolError, http};
//!
//! fn weather(city: &str) -> Result<serde_json::Value, ToolError> {
//!     let key = toolsmith_sdk::secret("weather_api_key")?;
//!     http::get(&format!("https://api.weather.example/v1/now?city={city}"))
//!         .header("authorization", &format!("Bearer {key}"))
//!         .send()?
//!         .error_for_status()?
//!         .json()
//! }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ToolError;

/// A request being built; [`Request::send`] makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A `GET` request to `url`.
pub fn get(url: &str) -> Request {
    request("GET", url)
}

/// A `POST` request to `url`.
pub fn post(url: &str) -> Request {
    request("POST", url)
}

/// A request with any method.
pub fn request(method: &str, url: &str) -> Request {
    Request { method: method.to_owned(), url: url.to_owned(), headers: Vec::new(), body: Vec::new() }
}

impl Request {
    /// Adds a header (the host sets `host` itself and refuses it here).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets a JSON body and its content type.
    pub fn json<T: Serialize>(self, value: &T) -> Result<Self, ToolError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| ToolError::new("invalid_request", format!("cannot encode the body: {e}")))?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// Makes the request through the host. Outside a host (native tests) it fails with code
    /// `not_in_host`.
    pub fn send(self) -> Result<Response, ToolError> {
        #[cfg(target_arch = "wasm32")]
        {
            use crate::bindings::toolsmith::tool::capabilities;
            let out = capabilities::http(&capabilities::HttpRequest {
                method: self.method,
                url: self.url,
                headers: self.headers,
                body: self.body,
            })?;
            Ok(Response { status: out.status, headers: out.headers, body: out.body })
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            Err(ToolError::new("not_in_host", format!("cannot fetch {}: HTTP goes through a Toolsmith host", self.url)))
        }
    }
}

/// A response: status, headers (names lower case) and the whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, in the order the server sent them.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, ToolError> {
        std::str::from_utf8(&self.body)
            .map_err(|e| ToolError::new("invalid_response", format!("the body is not UTF-8: {e}")))
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ToolError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ToolError::new("invalid_response", format!("the body is not the JSON expected: {e}")))
    }

    /// The response itself when its status is 2xx, else a `http_status` error.
    pub fn error_for_status(self) -> Result<Self, ToolError> {
        if (200..300).contains(&self.status) {
            Ok(self)
        } else {
            Err(ToolError::new("http_status", format!("the server answered {}", self.status)))
        }
    }
}

/// Reads a secret an operator granted this tool (`toolsmith tools grant NAME --secret
/// NAME=env:VAR`). The host scrubs the value from the call's result, errors and logs.
pub fn secret(name: &str) -> Result<String, ToolError> {
    #[cfg(target_arch = "wasm32")]
    {
        Ok(crate::bindings::toolsmith::tool::capabilities::secret(name)?)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        Err(ToolError::new("not_in_host", format!("cannot read secret `{name}`: secrets come from a Toolsmith host")))
    }
}
