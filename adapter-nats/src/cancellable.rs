//! Futures a machine may give up: each is kept under the id the machine named it
//! by, and dropped when the machine says (a request, a reply, a subscribe or a
//! reject it cancelled). One mechanism for the service loop and the member's
//! driver.

use std::collections::BTreeMap;
use std::future::Future;

use futures::FutureExt as _;
use futures::future::{AbortHandle, BoxFuture, abortable};

/// The futures under way that a machine may cancel, by id.
#[derive(Debug)]
pub(crate) struct Cancellable<K: Ord> {
    under_way: BTreeMap<K, AbortHandle>,
}

impl<K: Ord> Cancellable<K> {
    pub(crate) fn new() -> Self {
        Self {
            under_way: BTreeMap::new(),
        }
    }

    /// `future`, droppable by [`Self::cancel`] of `id`: it resolves to `None`
    /// once cancelled. One already under way with the same id is cancelled.
    pub(crate) fn start<F>(&mut self, id: K, future: F) -> BoxFuture<'static, Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send,
    {
        let (future, handle) = abortable(future);
        if let Some(old) = self.under_way.insert(id, handle) {
            old.abort();
        }
        future.map(Result::ok).boxed()
    }

    /// The future of `id` ended on its own: nothing to cancel any more.
    pub(crate) fn finished(&mut self, id: &K) {
        self.under_way.remove(id);
    }

    /// Drops the future of `id`, if it is still under way.
    pub(crate) fn cancel(&mut self, id: &K) {
        if let Some(handle) = self.under_way.remove(id) {
            handle.abort();
        }
    }
}
