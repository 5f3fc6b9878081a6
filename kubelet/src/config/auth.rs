//! The :10250 authentication and authorization settings from flags and the file
//! (`authentication.*`, `authorization.*`, the webhook cache TTLs), as upstream defaults them.

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::flags::Flags;

/// `authentication` / `authorization`: flags over the file. Upstream's defaults differ with and
/// without a config file: v1beta1's (anonymous off, webhook on, mode Webhook) apply to a file,
/// the legacy flag defaults (anonymous on, webhook off, AlwaysAllow) when there is none.
pub(super) fn auth_settings(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<crate::server::AuthSettings, ConfigError> {
    let has_file = flags.config.is_some();
    let authn = file.authentication.clone().unwrap_or_default();
    let authz = file.authorization.clone().unwrap_or_default();
    let anonymous = flags
        .anonymous_auth
        .or(authn.anonymous.and_then(|a| a.enabled))
        .unwrap_or(!has_file);
    let webhook = flags
        .authentication_token_webhook
        .or(authn.webhook.as_ref().and_then(|w| w.enabled))
        .unwrap_or(has_file);
    // v1beta1 defaulting: an absent or zero TTL (kubeadm writes `0s`) is the default.
    let ttl = |name: &str, v: Option<&serde_json::Value>, default: u64| {
        let d = match v {
            None | Some(serde_json::Value::Null) => std::time::Duration::ZERO,
            Some(serde_json::Value::String(s)) => {
                plumbing::duration::parse(s).map_err(|e| invalid(format!("{name}: {e}")))?
            }
            Some(other) => {
                return Err(invalid(format!(
                    "{name}: want a duration string, got {other}"
                )));
            }
        };
        Ok(if d.is_zero() {
            std::time::Duration::from_secs(default)
        } else {
            d
        })
    };
    // A flag applies after defaulting, as upstream's: `0s` there turns the cache off.
    let flag_ttl = |name: &str, v: &Option<String>| {
        v.as_deref()
            .map(|s| plumbing::duration::parse(s).map_err(|e| invalid(format!("--{name}: {e}"))))
            .transpose()
    };
    let cache_ttl = match flag_ttl(
        "authentication-token-webhook-cache-ttl",
        &flags.authentication_token_webhook_cache_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authentication.webhook.cacheTTL",
            authn.webhook.as_ref().and_then(|w| w.cache_ttl.as_ref()),
            120,
        )?,
    };
    let authz_webhook = authz.webhook.clone().unwrap_or_default();
    let cache_authorized_ttl = match flag_ttl(
        "authorization-webhook-cache-authorized-ttl",
        &flags.authorization_webhook_cache_authorized_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authorization.webhook.cacheAuthorizedTTL",
            authz_webhook.cache_authorized_ttl.as_ref(),
            300,
        )?,
    };
    let cache_unauthorized_ttl = match flag_ttl(
        "authorization-webhook-cache-unauthorized-ttl",
        &flags.authorization_webhook_cache_unauthorized_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authorization.webhook.cacheUnauthorizedTTL",
            authz_webhook.cache_unauthorized_ttl.as_ref(),
            30,
        )?,
    };
    let client_ca_file = flags
        .client_ca_file
        .clone()
        .or(authn.x509.and_then(|x| x.client_ca_file))
        .filter(|s| !s.is_empty());
    let mode = flags
        .authorization_mode
        .clone()
        .or(authz.mode)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| if has_file { "Webhook" } else { "AlwaysAllow" }.into());
    let mode = crate::server::AuthzMode::parse(&mode)
        .map_err(|e| invalid(format!("authorization.mode: {e}")))?;
    Ok(crate::server::AuthSettings {
        anonymous,
        webhook,
        client_ca_file,
        mode,
        cache_ttl,
        cache_authorized_ttl,
        cache_unauthorized_ttl,
    })
}
