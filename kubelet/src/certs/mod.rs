//! The kubelet's certificates: the serving certificate of :10250 (`serving`: requested from the
//! apiserver with `serverTLSBootstrap`, rotated before expiry and swapped under the listener).
//! The client certificate's bootstrap and rotation live in [`bootstrap`].

pub mod bootstrap;
pub mod serving;

pub use bootstrap::check_key_pair;
pub use serving::{ServingCertResolver, ServingError, ServingManager, ServingSettings};
