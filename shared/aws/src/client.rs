//! SDK clients built on first use.

use std::sync::{Arc, LazyLock};

use aws_config::SdkConfig;

/// How a [`LazyClient`] makes its client the first time it is used.
type Build<C> = Box<dyn FnOnce() -> C + Send>;

/// An SDK service client that is built the first time it is used, then shared by every clone.
///
/// Building a client is work a function's init would pay whether or not any event ever uses
/// it: the client's configuration, its runtime plugins and its endpoint resolver (the partition
/// table is parsed once per service crate). A function holds some clients only for rare paths
/// (a submit that reads an upload, a stage that hands a job to Step Functions), so adapters
/// hold their client as a `LazyClient`: what the first event needs is built by the warm-up
/// ([`crate::sdk::warm_up`]), the rest by its first request or never. (DynamoDB's client,
/// which every function's first event uses, is built at init as it is.)
///
/// A client's constructor panics only on a configuration the code got wrong (no behaviour
/// version, retries without a sleep implementation); [`crate::sdk::sdk_config_from`] sets
/// those, and every test that makes an AWS call builds its clients the same way. Were it to
/// panic, a lazy client would do so at its first use, not at init, and every use after (the
/// lock stays poisoned): one reason DynamoDB's client, which every function uses, is eager.
///
/// Dereferences to the client. A client built already converts with `From` (tests, callers
/// that share one).
pub struct LazyClient<C>(Arc<LazyLock<C, Build<C>>>);

impl<C: Send + 'static> LazyClient<C> {
    /// A client that `build` makes from `sdk` on first use (`aws_sdk_sqs::Client::new`).
    pub fn of(sdk: &SdkConfig, build: fn(&SdkConfig) -> C) -> Self {
        let sdk = sdk.clone();
        LazyClient(Arc::new(LazyLock::new(Box::new(move || build(&sdk)))))
    }

    /// Whether the client has been built (its first use happened).
    pub fn is_built(&self) -> bool {
        LazyLock::get(&self.0).is_some()
    }
}

impl<C: Send + 'static> From<C> for LazyClient<C> {
    fn from(client: C) -> Self {
        let built: LazyLock<C, Build<C>> = LazyLock::new(Box::new(move || client));
        LazyLock::force(&built);
        LazyClient(Arc::new(built))
    }
}

impl<C> Clone for LazyClient<C> {
    fn clone(&self) -> Self {
        LazyClient(self.0.clone())
    }
}

impl<C> std::ops::Deref for LazyClient<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.0
    }
}

impl<C: std::fmt::Debug> std::fmt::Debug for LazyClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match LazyLock::get(&self.0) {
            Some(client) => client.fmt(f),
            None => f.write_str("LazyClient(not built)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static BUILT: AtomicUsize = AtomicUsize::new(0);

    fn counting(sdk: &SdkConfig) -> Option<String> {
        BUILT.fetch_add(1, Ordering::SeqCst);
        sdk.region().map(|region| region.to_string())
    }

    #[test]
    fn a_lazy_client_is_built_once_on_first_use_and_shared_by_its_clones() {
        let sdk = SdkConfig::builder().region(aws_config::Region::new("eu-west-1")).build();
        let client = LazyClient::of(&sdk, counting);
        let clone = client.clone();
        assert!(!client.is_built());
        assert_eq!(BUILT.load(Ordering::SeqCst), 0);
        assert_eq!(clone.as_deref(), Some("eu-west-1"));
        assert_eq!(client.as_deref(), Some("eu-west-1"));
        assert!(client.is_built());
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_client_built_already_is_used_as_it_is() {
        let client = LazyClient::from(7_u32);
        assert!(client.is_built());
        assert_eq!(*client, 7);
        assert_eq!(format!("{client:?}"), "7");
    }
}
