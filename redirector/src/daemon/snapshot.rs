//! The one cached rendering of `/metrics` that every scrape is served from.
//!
//! A rendering walks the node: every pod's counters, every map's entries. Done per scrape,
//! 200 scrapers at once were 200 walks on the blocking pool competing with the pod adds
//! for the node's CPUs (and each holding its maps and text). Here a rendering is made at
//! most once per [`MAX_AGE`]: scrapes that arrive while one is being made wait for it and
//! share it, and the walk holds the cache's lock until it ends — even when the scrape that
//! started it has gone — so two walks never run at once.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::body::Bytes;
use tokio::sync::Mutex;

/// How old a rendering may be and still be served.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// A rendering: the body every scrape sends (shared, not copied), or why there is none
/// (shared too, so a walk that fails is not retried by every waiting scrape).
pub type Rendered = Result<Bytes, Arc<str>>;

/// The cache, and the state a rendering keeps from one to the next (`S`: open maps, the
/// counters of pods gone since).
pub struct Snapshots<S> {
    inner: Arc<Mutex<Cache<S>>>,
    max_age: Duration,
}

struct Cache<S> {
    latest: Option<(Instant, Rendered)>,
    state: S,
}

impl<S: Send + 'static> Snapshots<S> {
    pub fn new(state: S) -> Self {
        Self::with_max_age(state, MAX_AGE)
    }

    fn with_max_age(state: S, max_age: Duration) -> Self {
        Snapshots {
            inner: Arc::new(Mutex::new(Cache {
                latest: None,
                state,
            })),
            max_age,
        }
    }

    /// The latest rendering if it is younger than the maximum age, else a new one made by
    /// `render` on the blocking pool. Callers queue on one lock (in arrival order), so
    /// while a rendering is made the others wait and then take it.
    pub async fn get(
        &self,
        render: impl FnOnce(&mut S) -> Result<String, String> + Send + 'static,
    ) -> Rendered {
        let mut cache = Arc::clone(&self.inner).lock_owned().await;
        if let Some((taken, rendered)) = &cache.latest {
            if taken.elapsed() < self.max_age {
                return rendered.clone();
            }
        }
        // The guard moves into the blocking task: the lock is held until the walk ends,
        // whether or not this scrape is still there to see it.
        let walk = tokio::task::spawn_blocking(move || {
            let rendered: Rendered = match render(&mut cache.state) {
                Ok(text) => Ok(Bytes::from(text)),
                Err(why) => Err(why.into()),
            };
            // Aged from the walk's end: renderings start at least `max_age` apart.
            cache.latest = Some((Instant::now(), rendered.clone()));
            rendered
        });
        walk.await
            .unwrap_or_else(|err| Err(format!("rendering the metrics: {err}").into()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A render that counts itself, notes how many run at once, and takes 20 ms.
    fn counting(
        made: &Arc<AtomicUsize>,
        running: &Arc<AtomicUsize>,
        most: &Arc<AtomicUsize>,
    ) -> impl FnOnce(&mut u32) -> Result<String, String> + Send + 'static {
        let (made, running, most) = (Arc::clone(made), Arc::clone(running), Arc::clone(most));
        move |state: &mut u32| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            *state += 1;
            made.fetch_add(1, Ordering::SeqCst);
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(format!("rendering {state}"))
        }
    }

    /// `n` scrapes at once, each with a [`counting`] render over `[made, running, most]`.
    fn scrape(
        snapshots: &Arc<Snapshots<u32>>,
        n: usize,
        [made, running, most]: [&Arc<AtomicUsize>; 3],
    ) -> Vec<tokio::task::JoinHandle<Rendered>> {
        (0..n)
            .map(|_| {
                let snapshots = Arc::clone(snapshots);
                let render = counting(made, running, most);
                tokio::spawn(async move { snapshots.get(render).await })
            })
            .collect()
    }

    #[test]
    fn concurrent_scrapes_share_one_rendering() {
        runtime().block_on(async {
            let snapshots = Arc::new(Snapshots::with_max_age(0u32, Duration::from_secs(60)));
            let [made, running, most] = [(); 3].map(|()| Arc::new(AtomicUsize::new(0)));
            let scrapes = scrape(&snapshots, 200, [&made, &running, &most]);
            for scrape in scrapes {
                assert_eq!(&scrape.await.unwrap().unwrap()[..], b"rendering 1");
            }
            assert_eq!(made.load(Ordering::SeqCst), 1);
        });
    }

    #[test]
    fn an_old_rendering_is_made_again_one_at_a_time() {
        runtime().block_on(async {
            // Every rendering is too old for the next caller.
            let snapshots = Arc::new(Snapshots::with_max_age(0u32, Duration::ZERO));
            let [made, running, most] = [(); 3].map(|()| Arc::new(AtomicUsize::new(0)));
            let scrapes = scrape(&snapshots, 20, [&made, &running, &most]);
            for scrape in scrapes {
                scrape.await.unwrap().unwrap();
            }
            assert_eq!(made.load(Ordering::SeqCst), 20);
            assert_eq!(most.load(Ordering::SeqCst), 1, "two renderings at once");
        });
    }

    #[test]
    fn a_scrape_that_goes_away_leaves_its_walk_holding_the_lock() {
        runtime().block_on(async {
            let snapshots = Arc::new(Snapshots::with_max_age(0u32, Duration::from_secs(60)));
            let [made, running, most] = [(); 3].map(|()| Arc::new(AtomicUsize::new(0)));
            let first = {
                let snapshots = Arc::clone(&snapshots);
                let render = counting(&made, &running, &most);
                tokio::spawn(async move { snapshots.get(render).await })
            };
            while running.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            first.abort();
            let second = snapshots.get(counting(&made, &running, &most)).await;
            assert_eq!(&second.unwrap()[..], b"rendering 1", "the aborted walk's");
            assert_eq!(made.load(Ordering::SeqCst), 1);
            assert_eq!(most.load(Ordering::SeqCst), 1);
        });
    }

    #[test]
    fn a_failed_rendering_is_shared_too() {
        runtime().block_on(async {
            let snapshots = Snapshots::with_max_age((), Duration::from_secs(60));
            let first = snapshots.get(|_| Err("no maps".to_owned())).await;
            let second = snapshots.get(|_| Ok("text".to_owned())).await;
            assert_eq!(&*first.unwrap_err(), "no maps");
            assert_eq!(&*second.unwrap_err(), "no maps");
        });
    }
}
