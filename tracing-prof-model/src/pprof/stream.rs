//! [`Encoder`]: a pprof file written sample by sample, for
//! [`Snapshot::encode`](crate::Snapshot::encode).
//!
//! Protobuf lets a message's fields come in any order and a repeated field be split (a reader
//! appends what it finds; `go tool pprof`'s own decoder resolves ids and strings once it has
//! read the whole message). So the file is three messages back to back: the sample types;
//! each sample as it comes, its strings and locations interned into the [`Tables`] at once;
//! then the tables and the rest of the header. Decoded, it is the message
//! [`Profile::to_proto`] makes of the same samples, id for id.

use super::{Tables, addr, finish, labels, proto, sample_types};
use crate::build::{LabelRef, Samples, Stack, code_frame, span_frame};
use crate::profile::{Frame, FrameKind, Profile};
use flate2::write::GzEncoder;
use prost::Message;
use std::io::Write;

/// Bytes gathered before they go to the compressor.
const CHUNK: usize = 32 << 10;

/// Writes one profile: [`Encoder::new`], a [`Samples::push`] per sample, [`Encoder::finish`].
pub(crate) struct Encoder {
    tables: Tables,
    gz: GzEncoder<Vec<u8>>,
    /// Encoded messages not yet compressed.
    pending: Vec<u8>,
    /// One sample, its vectors kept from one sample to the next.
    sample: proto::Sample,
}

impl Encoder {
    /// A profile with `header`'s sample types; its samples follow.
    pub(crate) fn new(header: &Profile) -> Self {
        let mut tables = Tables::new(header.binary.as_ref());
        let head = proto::Profile {
            sample_type: sample_types(&mut tables, header),
            ..Default::default()
        };
        Encoder {
            tables,
            gz: GzEncoder::new(Vec::new(), flate2::Compression::default()),
            pending: head.encode_to_vec(),
            sample: proto::Sample::default(),
        }
    }

    /// The gzip'd file: the samples pushed, then `header` (the one given to
    /// [`Encoder::new`]) and the tables.
    pub(crate) fn finish(mut self, header: &Profile) -> Vec<u8> {
        let mut rest = proto::Profile::default();
        finish(self.tables, header, &mut rest);
        rest.encode_raw(&mut self.pending);
        // Writing into a Vec cannot fail.
        let _ = self.gz.write_all(&self.pending);
        self.gz.finish().unwrap_or_default()
    }

    /// The location of a span frame borrowed from the snapshot.
    fn span_location(&mut self, f: &crate::SpanFrame) -> u64 {
        let key = (
            FrameKind::Span,
            [
                addr(Some(&f.target)),
                addr(Some(&f.name)),
                addr(Some(&f.path_name)),
                addr(f.file.as_ref()),
            ],
            f.line.unwrap_or(0),
            0,
        );
        self.tables.location(key, || span_frame(f))
    }

    /// The location of a code frame borrowed from the snapshot.
    fn code_location(&mut self, f: &crate::CodeFrame) -> u64 {
        let key = (
            FrameKind::Code,
            [addr(Some(&f.function)), addr(f.file.as_ref()), 0, 0],
            f.line.unwrap_or(0),
            0,
        );
        self.tables.location(key, || code_frame(f))
    }
}

impl Samples for Encoder {
    fn push(&mut self, stack: Stack<'_>, values: &[i64], sample_labels: &[LabelRef<'_>]) {
        let mut sample = std::mem::take(&mut self.sample);
        sample.location_id.clear();
        sample.value.clear();
        sample.label.clear();
        // Leaf first, as pprof stores stacks.
        match stack {
            Stack::Path(spans, code) => {
                for f in code.into_iter().flat_map(|c| c.iter().rev()) {
                    sample.location_id.push(self.code_location(f));
                }
                for f in spans.iter().rev() {
                    sample.location_id.push(self.span_location(f));
                }
            }
            // A name made for this sample: by content (a thread is met once per profile).
            Stack::Thread(name) => sample
                .location_id
                .push(
                    self.tables
                        .new_location(&Frame::new(FrameKind::Thread, name, None, None)),
                ),
        }
        sample.value.extend_from_slice(values);
        labels(
            &mut self.tables,
            sample_labels.iter().copied(),
            &mut sample.label,
        );
        // Field 2 of `Profile`: `repeated Sample sample`.
        prost::encoding::message::encode(2, &sample, &mut self.pending);
        self.sample = sample;
        if self.pending.len() >= CHUNK {
            let _ = self.gz.write_all(&self.pending);
            self.pending.clear();
        }
    }
}
