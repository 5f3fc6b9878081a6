//! Masquerade of pod traffic that leaves the cluster CIDR. The rules live in a table of our
//! own (`ip node-agent` / `ip6 node-agent`, one `postrouting` nat chain each), replaced in
//! one `nft -f -` transaction: no other table or chain is read or written. The edge is the
//! [`Masquerade`] trait; [`NftMasquerade`] runs `nft`, the fake lives in `fake.rs`.

use std::time::Duration;

use plumbing::cidr::Cidr;
use plumbing::process::{Command, RunError};

use super::NetworkError;

/// Our nft table's name (in the `ip` and `ip6` families).
pub const TABLE: &str = "node-agent";
/// Bound on one `nft` run.
const NFT_TIMEOUT: Duration = Duration::from_secs(30);

#[async_trait::async_trait]
pub trait Masquerade: Send + Sync {
    /// Makes the kernel masquerade traffic from `cluster_cidrs` to outside them (replacing
    /// whatever our table held).
    async fn apply(&self, cluster_cidrs: &[Cidr]) -> Result<(), NetworkError>;
}

/// The transaction: per family with a CIDR, create-then-delete our table (so a leftover
/// goes in the same atomic step) and write it afresh. Multicast is never masqueraded.
pub fn render(cluster_cidrs: &[Cidr]) -> String {
    let mut out = String::new();
    for cidr in cluster_cidrs {
        let (family, proto, multicast) = if cidr.is_ipv4() {
            ("ip", "ip", "224.0.0.0/4")
        } else {
            ("ip6", "ip6", "ff00::/8")
        };
        out.push_str(&format!(
            "add table {family} {TABLE}\n\
             delete table {family} {TABLE}\n\
             table {family} {TABLE} {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\t{proto} saddr {cidr} {proto} daddr != {cidr} {proto} daddr != {multicast} masquerade fully-random\n\
             \t}}\n\
             }}\n"
        ));
    }
    out
}

/// [`Masquerade`] through the `nft` binary (in this process's network namespace).
#[derive(Debug, Default)]
pub struct NftMasquerade;

#[async_trait::async_trait]
impl Masquerade for NftMasquerade {
    async fn apply(&self, cluster_cidrs: &[Cidr]) -> Result<(), NetworkError> {
        let text = render(cluster_cidrs);
        if text.is_empty() {
            return Ok(());
        }
        let argv = vec!["nft".to_string(), "-f".to_string(), "-".to_string()];
        let out = Command::new(argv, NFT_TIMEOUT)
            .stdin(text.as_bytes())
            .run()
            .await
            .map_err(|e| {
                NetworkError::Masquerade(match e {
                    RunError::Spawn { source } => format!("running nft: {source}"),
                    RunError::Timeout { .. } => format!("nft took over {NFT_TIMEOUT:?}"),
                    e => format!("nft: {e}"),
                })
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(NetworkError::Masquerade(format!(
                "nft -f - failed ({}): {}",
                out.status,
                out.stderr_lossy().trim()
            )))
        }
    }
}
