//! The kubelet's certificates: the serving certificate of :10250 (`serving`: requested from the
//! apiserver with `serverTLSBootstrap`, rotated before expiry and swapped under the listener).
//! A configured pair (`tlsCertFile`) is reloaded when its files change (`serving_files`).
//! The client certificate's bootstrap and rotation live in [`bootstrap`].

pub mod bootstrap;
pub mod serving;
pub mod serving_files;

pub use bootstrap::check_key_pair;
pub use serving::{ServingCertResolver, ServingError, ServingManager, ServingSettings};
