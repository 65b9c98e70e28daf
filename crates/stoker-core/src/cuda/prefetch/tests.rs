use super::*;
use crate::cuda::FakeDevice;

/// Ends the epoch once, then panics.
struct Panicking(bool);

impl HostBatches for Panicking {
    type Mark = u32;
    fn pull(&mut self, _: Duration) -> Pulled<u32> {
        if std::mem::replace(&mut self.0, true) {
            panic!("feed exploded");
        }
        Pulled::Item(Ok(None), 7)
    }
}

#[test]
fn a_panicking_feed_becomes_an_error_then_the_thread_is_gone() {
    let fake = FakeDevice::new(0).unwrap();
    let config = PrefetchConfig {
        max_slots: 2,
        slots: 2,
        stream: None,
        stats: None,
    };
    let mut p = Prefetcher::start(Panicking(false), fake.clone(), config).unwrap();
    let (item, mark) = p.next(None, &crate::close::Closer::new()).unwrap();
    assert!(matches!(item, Ok(None)) && mark == Some(7));
    let (item, mark) = p.next(None, &crate::close::Closer::new()).unwrap();
    let err = item.unwrap_err();
    assert!(err.to_string().contains("feed exploded"), "{err}");
    assert!(mark.is_none());
    let err = p.next(None, &crate::close::Closer::new()).unwrap_err();
    assert!(err.to_string().contains("has exited"), "{err}");
    drop(p);
    let c = fake.counters();
    assert_eq!((c.live_streams, c.live_events), (0, 0), "{c:?}");
}
