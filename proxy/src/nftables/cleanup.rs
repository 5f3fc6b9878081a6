//! What `--cleanup` and a mode switch remove of the nftables mode: both families' `kube-proxy`
//! tables (`add` first, so that deleting one that is not there is no error).

use tracing::info;

use super::names::TABLE;
use super::render::family_word;
use super::runner::{NftRunner, Result};
use crate::model::IpFamily;

/// Deletes the `ip` and `ip6` `kube-proxy` tables, if any. Returns how many families were
/// cleaned (a family the kernel does not have is skipped).
pub async fn cleanup<R: NftRunner>(runner: &R) -> Result<usize> {
    let mut n = 0;
    let mut last_err = None;
    for fam in [IpFamily::V4, IpFamily::V6] {
        let f = family_word(fam);
        let text = format!("add table {f} {TABLE}\ndelete table {f} {TABLE}\n");
        match runner.apply(&text).await {
            Ok(()) => {
                info!(
                    family = f,
                    "nftables table {TABLE} removed (if it was there)"
                );
                n += 1;
            }
            Err(e) => last_err = Some(e),
        }
    }
    match (n, last_err) {
        (0, Some(e)) => Err(e),
        _ => Ok(n),
    }
}
