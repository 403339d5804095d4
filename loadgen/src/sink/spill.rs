//! The sink's spill file: unacknowledged batches past the memory bound, in
//! batch order, each a little-endian `u32` length followed by the
//! prost-encoded `RecordBatch`.
//!
//! All I/O goes through `tokio::fs`, which runs it on the blocking pool: the
//! sink's task waits for the disk, the async workers and the requests do not.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use benchfleet_proto as pb;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Makes file names unique among the sinks of one process (tests run many).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// An open spill file. Dropping it removes the file, unless it was asked to
/// keep it (it then holds records the controller never stored).
pub(crate) struct Spill {
    path: PathBuf,
    writer: tokio::fs::File,
    reader: tokio::fs::File,
    /// Encoded sizes of the batches written and not yet read back, in order:
    /// the sink decides from them whether the next one fits in memory.
    sizes: VecDeque<usize>,
    keep: bool,
}

impl Spill {
    /// Creates an empty spill file in `dir` for `attempt`.
    pub(crate) async fn create(dir: &Path, attempt: &pb::AttemptRef) -> Result<Spill, (PathBuf, io::Error)> {
        let run: String =
            attempt.run_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let name = format!(
            "benchfleet-loadgen-spill-{run}-{}-{}-{}-{}.bin",
            attempt.job,
            attempt.attempt,
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let open = async {
            let writer = tokio::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&path).await?;
            let reader = tokio::fs::File::open(&path).await?;
            Ok::<_, io::Error>((writer, reader))
        };
        match open.await {
            Ok((writer, reader)) => Ok(Spill { path, writer, reader, sizes: VecDeque::new(), keep: false }),
            Err(e) => Err((path, e)),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a batch at the end of the file.
    pub(crate) async fn append(&mut self, batch: &pb::RecordBatch) -> io::Result<()> {
        let entry = encode_entry(batch)?;
        self.writer.write_all(&entry).await?;
        // The reader is another handle: what it reads must have left ours.
        self.writer.flush().await?;
        self.sizes.push_back(entry.len() - LENGTH_BYTES);
        Ok(())
    }

    /// The encoded size of the oldest batch not yet read back, if any.
    pub(crate) fn next_size(&self) -> Option<usize> {
        self.sizes.front().copied()
    }

    /// Reads back the oldest batch not yet read back; only call it when
    /// [`Spill::next_size`] says there is one.
    pub(crate) async fn next(&mut self) -> io::Result<pb::RecordBatch> {
        let expected = self.sizes.pop_front().ok_or_else(|| corrupt("read past the last batch written"))?;
        let batch = read_entry(&mut self.reader).await?.ok_or_else(|| corrupt("the file ends early"))?;
        if batch.encoded_len() != expected {
            return Err(corrupt("a batch read back differs in size from the one written"));
        }
        Ok(batch)
    }

    /// Leaves the file in place when this is dropped.
    pub(crate) fn keep_on_drop(&mut self) {
        self.keep = true;
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        if !self.keep
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the spill file");
        }
    }
}

const LENGTH_BYTES: usize = 4;

/// One entry of the file: the length, then the encoded batch.
fn encode_entry(batch: &pb::RecordBatch) -> io::Result<Vec<u8>> {
    let len = batch.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| corrupt("a batch exceeds 4 GiB encoded"))?;
    let mut entry = Vec::with_capacity(LENGTH_BYTES + len);
    entry.extend_from_slice(&prefix.to_le_bytes());
    batch.encode(&mut entry).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(entry)
}

/// The next entry of a spill file; `None` at its clean end.
async fn read_entry(reader: &mut (impl tokio::io::AsyncRead + Unpin)) -> io::Result<Option<pb::RecordBatch>> {
    let mut prefix = [0u8; LENGTH_BYTES];
    match reader.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut encoded = vec![0u8; u32::from_le_bytes(prefix) as usize];
    reader.read_exact(&mut encoded).await?;
    pb::RecordBatch::decode(encoded.as_slice()).map(Some).map_err(|e| corrupt(&format!("a batch does not decode: {e}")))
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("spill file corrupt: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u64, records: u64) -> pb::RecordBatch {
        pb::RecordBatch {
            attempt: Some(pb::AttemptRef { run_id: "run/1".into(), job: 3, attempt: 1, epoch: 0 }),
            sent: 0,
            batch: n,
            records: (0..records)
                .map(|seq| pb::RequestRecord {
                    seq: n * 100 + seq,
                    chunk_ns: vec![1, 2, 3],
                    chunk_tokens: vec![1, 1, 1],
                    ..pb::RequestRecord::default()
                })
                .collect(),
            summary: (n == 2).then(pb::Summary::default),
        }
    }

    #[tokio::test]
    async fn batches_read_back_in_order_and_the_file_goes_with_the_spill() {
        let dir = tempfile::tempdir().expect("temp dir");
        let attempt = pb::AttemptRef { run_id: "run/1".into(), job: 3, attempt: 1, epoch: 0 };
        let mut spill = Spill::create(dir.path(), &attempt).await.expect("create");
        let path = spill.path().to_owned();
        assert!(path.starts_with(dir.path()) && !path.to_string_lossy().contains("run/1"), "{}", path.display());
        let written = [batch(0, 2), batch(1, 0), batch(2, 5)];
        for b in &written {
            spill.append(b).await.expect("append");
        }
        assert_eq!(spill.next_size(), Some(written[0].encoded_len()));
        assert_eq!(spill.next().await.expect("read"), written[0]);
        // Appending while reading: the order stays that of the writes.
        spill.append(&batch(3, 1)).await.expect("append");
        for b in [&written[1], &written[2], &batch(3, 1)] {
            assert_eq!(spill.next().await.expect("read"), *b);
        }
        assert_eq!(spill.next_size(), None);

        // The format, read independently: length-prefixed prost batches.
        let bytes = std::fs::read(&path).expect("read file");
        let mut reader = bytes.as_slice();
        let mut read = Vec::new();
        while let Some(b) = read_entry(&mut reader).await.expect("entry") {
            read.push(b.batch);
        }
        assert_eq!(read, [0, 1, 2, 3]);

        drop(spill);
        assert!(!path.exists(), "dropping the spill removes its file");
    }

    #[tokio::test]
    async fn a_kept_spill_stays_and_a_truncated_file_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let attempt = pb::AttemptRef { run_id: "r".into(), job: 0, attempt: 0, epoch: 0 };
        let mut spill = Spill::create(dir.path(), &attempt).await.expect("create");
        spill.append(&batch(0, 3)).await.expect("append");
        let path = spill.path().to_owned();
        spill.keep_on_drop();
        drop(spill);
        let bytes = std::fs::read(&path).expect("kept");
        let mut truncated = &bytes[..bytes.len() - 1];
        let err = read_entry(&mut truncated).await.expect_err("truncated");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
