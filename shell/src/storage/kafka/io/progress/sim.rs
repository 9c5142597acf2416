//! The progress reader on madsim-rdkafka's simulated broker, whose consumer polls
//! asynchronously and has no `position`.

use std::collections::BTreeMap;
use std::time::Duration;

use madsim_rdkafka::Message;
use madsim_tokio as tokio;

use super::{ProgressReader, ReaderState};
use crate::storage::ports::StorageError;

/// How far the progress topic was read: the next offset to read, per partition (the
/// offsets of what the consumer returned tell it).
#[derive(Default)]
pub struct Position {
    next: BTreeMap<i32, i64>,
}

impl Position {
    /// Whether every partition's next offset reached `highs`.
    fn reached(&self, highs: &BTreeMap<i32, i64>) -> bool {
        highs
            .iter()
            .all(|(p, &hi)| hi <= 0 || self.next.get(p).is_some_and(|&n| n >= hi))
    }

    /// `m` was read.
    fn read<M: Message>(&mut self, m: &M) {
        self.next.insert(m.partition(), m.offset() + 1);
    }
}

impl ProgressReader {
    /// Reads until every partition's next offset reaches `highs` (the simulated consumer
    /// has no `position`: the offsets of what it returned tell it).
    pub(super) async fn read_up_to(
        &self,
        st: &mut ReaderState,
        highs: &BTreeMap<i32, i64>,
    ) -> Result<(), StorageError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            if st.position.reached(highs) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(StorageError::unavailable(format!(
                    "the progress topic could not be read to its end within {:?}",
                    self.timeout
                )));
            }
            match self.consumer.poll(Duration::from_millis(20)).await {
                None => tokio::time::sleep(Duration::from_millis(5)).await,
                Some(Err(e)) => tracing::warn!(error = %e, "progress topic read error"),
                Some(Ok(m)) => {
                    st.position.read(&m);
                    st.take(&m);
                }
            }
        }
    }
}
