//! The progress reader on a real broker: librdkafka's consumer knows its `position`, and
//! the lanes' positions carry leader epochs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::Offset as KOffset;
use unimesh_core::{GroupName, Partition};

use super::{lock, ProgressReader, ReaderState};
use crate::storage::kafka::io::client_log::LoggedConsumer;
use crate::storage::ports::StorageError;

/// How far the progress topic was read: the consumer's own `position`, so nothing is kept
/// here.
#[derive(Default)]
pub struct Position;

impl Position {
    /// Whether `consumer`'s position in `topic` reached `highs` in every partition.
    fn reached(&self, consumer: &LoggedConsumer, topic: &str, highs: &BTreeMap<i32, i64>) -> bool {
        match consumer.position() {
            Ok(pos) => highs.iter().all(|(&p, &hi)| {
                hi <= 0
                    || pos
                        .find_partition(topic, p)
                        .is_some_and(|e| matches!(e.offset(), KOffset::Offset(o) if o >= hi))
            }),
            Err(_) => false,
        }
    }
}

impl ProgressReader {
    /// The lane's position reached a record of leader epoch `epoch`: later progress
    /// records of the lane are stamped with it (epochs only rise; `epochs.rs`).
    pub fn observe_epoch(&self, group: &GroupName, partition: Partition, epoch: i32) {
        if let Some(o) = lock(&self.owners).get_mut(&(group.clone(), partition)) {
            o.leader_epoch = Some(o.leader_epoch.map_or(epoch, |e| e.max(epoch)));
        }
    }

    /// Reads until every partition's position reaches `highs`.
    pub(super) async fn read_up_to(
        &self,
        st: &mut ReaderState,
        highs: &BTreeMap<i32, i64>,
    ) -> Result<(), StorageError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if st.position.reached(&self.consumer, &self.topic, highs) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(StorageError::unavailable(format!(
                    "the progress topic could not be read to its end within {:?}",
                    self.timeout
                )));
            }
            match self.consumer.poll(Duration::from_millis(20)) {
                None => {}
                Some(Err(e)) => tracing::warn!(error = %e, "progress topic read error"),
                Some(Ok(m)) => st.take(&m),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// Goal: a progress record's leader-epoch header is what the lane resumes with, and
    /// only a well-formed one. Method: records with the header, without it, and with a
    /// malformed one, read through `take` as the reader reads the topic.
    #[test]
    fn a_progress_records_leader_epoch_is_read_with_it() {
        use madsim_rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
        use madsim_rdkafka::Timestamp;
        let msg = |gen, epoch: Option<&str>, watermark| {
            let headers = epoch.map(|e| {
                OwnedHeaders::new().insert(Header {
                    key: LEADER_EPOCH_HEADER,
                    value: Some(e.as_bytes()),
                })
            });
            OwnedMessage::new(
                Some(super::super::tests::checkpoint(watermark, &[], &[]).encode()),
                Some(progress_key("g", "t", 0, gen).into_bytes()),
                "unimesh.progress".to_owned(),
                Timestamp::NotAvailable,
                HOME_PARTITION,
                0,
                headers,
            )
        };
        let read = |st: &ReaderState| {
            let c = st.chosen("g", "t", 0, Some(2), None).expect("a record");
            (c.checkpoint.map(|c| c.progress.watermark()), c.leader_epoch)
        };
        let mut st = ReaderState::default();
        st.take(&msg(Some(1), Some("4"), 10));
        assert_eq!(read(&st), (Some(10), Some(4)));
        st.take(&msg(Some(2), None, 12));
        assert_eq!(read(&st), (Some(12), None));
        st.take(&msg(Some(2), Some("-3"), 13));
        assert_eq!(read(&st), (Some(13), None));
        st.take(&msg(Some(2), Some("7"), 14));
        assert_eq!(read(&st), (Some(14), Some(7)));
    }
}
