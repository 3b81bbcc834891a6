//! A stream reopened at a saved position fetches the shard it stands in (and the read-ahead), not
//! the ones before it: a resumed run downloads from where its data stream stands. One test in its
//! own binary, because it points this process's hub client at the local server through the
//! environment. The splits of a repo share one listing request.

mod common;

use common::hub_server::Hub;
use common::{shard_indices, sharded_split};
use data::Example;
use data::registry::{self, Split};
use data::source::{ExampleStream, SourceOptions, StreamPosition, split_files};

#[test]
fn a_resumed_stream_fetches_from_its_position() {
    let hub = Hub::start(sharded_split(50, 20));
    let home = tempfile::tempdir().unwrap();
    // SAFETY: the only test of this binary sets the environment before any thread reads it (the
    // hub server's threads never do).
    unsafe {
        std::env::set_var("HF_ENDPOINT", hub.endpoint());
        std::env::set_var("HF_HOME", home.path());
    }
    let spec = registry::lookup("wmt14_de_en").unwrap();
    let files = split_files(spec, Split::Train, &SourceOptions::default()).unwrap();
    assert_eq!(files.len(), 50);
    assert!(
        hub.fetched().is_empty(),
        "listing the split downloaded shards: {:?}",
        hub.fetched()
    );
    // Every split of a repo reads one listing: the validation split asks the hub nothing more.
    let validation = split_files(spec, Split::Validation, &SourceOptions::default()).unwrap();
    assert_eq!(validation.len(), 1);
    let listings = hub
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, target, _)| target.contains("/tree/main"))
        .count();
    assert_eq!(listings, 1, "the repo was listed {listings} times");

    let at = StreamPosition { file: 30, row: 18 };
    let first: Vec<Example> = ExampleStream::open_at(spec, files, at)
        .unwrap()
        .take(3)
        .map(Result::unwrap)
        .collect();
    match &first[..] {
        [
            Example::Seq2Seq { source, .. },
            _,
            Example::Seq2Seq { source: third, .. },
        ] => {
            assert_eq!(source, "Sentence 18 of shard 30");
            assert_eq!(third, "Sentence 0 of shard 31");
        }
        other => panic!("{other:?}"),
    }
    // Let the read-ahead finish (local shards of a few KB take milliseconds): it must stop at
    // `READ_AHEAD` shards past the one being read, not go on through the split.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let downloaded = shard_indices(&hub.fetched());
    assert!(
        downloaded.contains(&30) && downloaded.contains(&31),
        "{downloaded:?}"
    );
    assert!(
        downloaded
            .iter()
            .all(|&s| (30..=31 + data::shards::READ_AHEAD).contains(&s)),
        "{downloaded:?}"
    );
}
