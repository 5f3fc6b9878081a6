//! Upstream's flags for KubeletConfiguration fields the agent acts on through the file
//! (`--enable-server`, `--enable-debugging-handlers`, `--make-iptables-util-chains`,
//! `--rotate-server-certificates`, `--volume-stats-agg-period`): each given flag replaces the
//! field before the merge, so it works exactly as the field does. Flags win, as upstream.

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::settings::cli::ExtraFlags;

/// Writes the given flags over the file's fields.
pub(super) fn apply(
    flags: &ExtraFlags,
    file: &mut KubeletConfiguration,
) -> Result<(), ConfigError> {
    if let Some(v) = flags.enable_server {
        file.enable_server = Some(v);
    }
    if let Some(v) = flags.enable_debugging_handlers {
        file.enable_debugging_handlers = Some(v);
    }
    if let Some(v) = flags.make_iptables_util_chains {
        file.make_ip_tables_util_chains = Some(serde_json::Value::Bool(v));
    }
    if let Some(v) = flags.rotate_server_certificates {
        file.server_tls_bootstrap = Some(v);
    }
    if let Some(text) = &flags.volume_stats_agg_period {
        let d = plumbing::duration::parse(text).map_err(|_| {
            invalid(format!(
                "--volume-stats-agg-period {text:?}: a negative period (upstream: no volume measurements) is not supported; 0s means the default 1m"
            ))
        })?;
        file.volume_stats_agg_period = Some(d);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
