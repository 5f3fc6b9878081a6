//! A test image credential provider plugin (the kubelet's exec protocol,
//! `credentialprovider.kubelet.k8s.io/v1`): reads a `CredentialProviderRequest` on standard
//! input and answers as its first argument says.
//!
//! ```text
//! credential-provider creds    # CREDS_USER/CREDS_PASSWORD for the image's registry
//! credential-provider hang     # never answers (the kubelet must kill it)
//! credential-provider garbage  # answers something that is not JSON
//! ```
//!
//! With `CREDS_LOG=<file>` each request is appended to the file (one JSON per line), the
//! service account token replaced by its length.

use std::io::{Read, Write};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "creds".into());
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        std::process::exit(2);
    }
    let mut request: serde_json::Value = match serde_json::from_str(&input) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("request is not JSON: {e}");
            std::process::exit(2);
        }
    };
    if let Ok(log) = std::env::var("CREDS_LOG") {
        if let Some(t) = request.get("serviceAccountToken").and_then(|t| t.as_str()) {
            request["serviceAccountToken"] = format!("<{} bytes>", t.len()).into();
        }
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{request}");
        }
    }
    match mode.as_str() {
        "hang" => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        "garbage" => {
            println!("this is not a CredentialProviderResponse");
        }
        _ => {
            let image = request["image"].as_str().unwrap_or("");
            let registry = image.split('/').next().unwrap_or("");
            let user = std::env::var("CREDS_USER").unwrap_or_default();
            let password = std::env::var("CREDS_PASSWORD").unwrap_or_default();
            let answer = serde_json::json!({
                "kind": "CredentialProviderResponse",
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                "cacheKeyType": "Registry",
                "cacheDuration": "5m0s",
                "auth": {registry: {"username": user, "password": password}},
            });
            println!("{answer}");
        }
    }
}
