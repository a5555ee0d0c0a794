//! The ZIP container, framed by hand so that where the writer stands serialises (see the crate
//! documentation for why no crate's writer fits).
//!
//! The archive is fully laid out before a byte of data is read: entry names and sizes are known
//! (the uploads' sizes), entries are STORED, and local headers carry a data descriptor, so every
//! offset — each local header, each entry's data, each descriptor, the central directory — is a
//! function of the names and sizes alone ([`Layout`]). Only the CRC-32s depend on the data. So
//! the writer's whole state is a [`Position`]: how many archive bytes are written, the CRC of
//! each finished entry, and the running CRC of the entry being written. [`Archiver`] turns a
//! `Position` and the inputs' bytes into the archive's bytes, in parts of a fixed size.
//!
//! Format (APPNOTE.TXT 6.3.10): per entry a local file header (general purpose flags: bit 3,
//! sizes and CRC in the data descriptor; bit 11, the name is UTF-8), the bytes as stored
//! (method 0), a data descriptor with its signature; then the central directory and the end of
//! central directory record. ZIP64 is used where a value needs it: an entry of 4 GiB - 1 bytes or
//! more gets a ZIP64 extra field in its local header (sizes `0xFFFFFFFF`) and 8-byte sizes in
//! its descriptor; a central directory record gets a ZIP64 extra field for its sizes and/or its
//! local header offset when they do not fit 32 bits; and a ZIP64 end of central directory record
//! and locator are written when the entry count, the directory's size or its offset do not fit
//! the classic record. [`Zip64::Always`] forces every one of those paths (tests read it back with
//! a real ZIP reader, since test data cannot reach 4 GiB).
//!
//! Every entry's timestamp is 1980-01-01 00:00 (the format's epoch): an archive's bytes depend
//! on its inputs only, so a resumed run writes exactly what an uninterrupted one would.

use serde::{Deserialize, Serialize};

/// Values at or above this do not fit a 32-bit field (`0xFFFFFFFF` means "see ZIP64").
const MAX_32: u64 = 0xFFFF_FFFF;
/// Entry counts at or above this do not fit the classic end record.
const MAX_16: u64 = 0xFFFF;

const LOCAL_HEADER: u32 = 0x0403_4b50;
const DATA_DESCRIPTOR: u32 = 0x0807_4b50;
const CENTRAL_HEADER: u32 = 0x0201_4b50;
const ZIP64_END: u32 = 0x0606_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const END: u32 = 0x0605_4b50;
const ZIP64_EXTRA: u16 = 0x0001;

/// Bit 3 (sizes and CRC follow the data, in a descriptor) and bit 11 (UTF-8 name).
const FLAGS: u16 = 0x0808;
/// "Version needed": 2.0 (data descriptor), 4.5 (ZIP64).
const NEEDED_20: u16 = 20;
const NEEDED_45: u16 = 45;
/// "Version made by": Unix (3), spec 4.5 — so `external attributes` carry a Unix mode.
const MADE_BY: u16 = (3 << 8) | 45;
/// A regular file, rw-r--r--, in the high half of the external attributes.
const EXTERNAL_ATTRIBUTES: u32 = 0o100_644 << 16;
/// 1980-01-01 (MS-DOS date: year since 1980 << 9 | month << 5 | day); the time is 00:00:00.
const DOS_DATE: u16 = (1 << 5) | 1;
const DOS_TIME: u16 = 0;

/// The longest entry name, in bytes (names are made unique by appending ` (n)`).
pub const MAX_NAME_BYTES: usize = 255;

/// When ZIP64 structures are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Zip64 {
    /// Only where a size, offset or count does not fit the classic fields.
    #[default]
    Auto,
    /// Everywhere (every entry, every directory record, the ZIP64 end records): for tests.
    Always,
}

/// One entry of the archive: its name and how many bytes it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The entry's name in the archive.
    pub name: String,
    /// The entry's size (the upload's size; stored, so also its compressed size).
    pub size: u64,
}

/// Where one entry's parts lie in the archive.
#[derive(Debug, Clone, Copy)]
struct Span {
    header_offset: u64,
    data_start: u64,
    data_end: u64,
    end: u64,
    /// Whether the entry's local header and descriptor use ZIP64 sizes.
    zip64: bool,
}

/// The archive's layout: every offset, from the members' names and sizes alone.
#[derive(Debug, Clone)]
pub struct Layout {
    members: Vec<Member>,
    spans: Vec<Span>,
    /// Input bytes before each entry (and the total, last).
    inputs_before: Vec<u64>,
    zip64: Zip64,
    directory_offset: u64,
    directory_len: u64,
    len: u64,
}

/// What lies at a position of the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Byte `at` of entry `entry`'s local header.
    Header { entry: usize, at: u64 },
    /// Byte `at` of entry `entry`'s data (byte `at` of its input).
    Data { entry: usize, at: u64 },
    /// Byte `at` of entry `entry`'s data descriptor.
    Descriptor { entry: usize, at: u64 },
    /// Byte `at` of the central directory and end records.
    Directory { at: u64 },
    /// The end of the archive.
    End,
}

/// Why members cannot make an archive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A name is empty or longer than [`MAX_NAME_BYTES`].
    #[error("entry name {0:?} is empty or longer than {MAX_NAME_BYTES} bytes")]
    Name(String),
    /// The archive would not fit 64-bit offsets.
    #[error("the archive would be too large")]
    TooLarge,
}

impl Layout {
    /// Lays out `members` in order.
    pub fn new(members: Vec<Member>, zip64: Zip64) -> Result<Layout, LayoutError> {
        let mut spans = Vec::with_capacity(members.len());
        let mut inputs_before = Vec::with_capacity(members.len() + 1);
        let (mut offset, mut inputs) = (0u64, 0u64);
        for member in &members {
            if member.name.is_empty() || member.name.len() > MAX_NAME_BYTES {
                return Err(LayoutError::Name(member.name.clone()));
            }
            let entry_zip64 = zip64 == Zip64::Always || member.size >= MAX_32;
            let header_len = 30 + member.name.len() as u64 + if entry_zip64 { 20 } else { 0 };
            let descriptor_len = if entry_zip64 { 24 } else { 16 };
            let data_start = offset + header_len;
            let data_end = data_start.checked_add(member.size).ok_or(LayoutError::TooLarge)?;
            let end = data_end + descriptor_len;
            spans.push(Span {
                header_offset: offset,
                data_start,
                data_end,
                end,
                zip64: entry_zip64,
            });
            inputs_before.push(inputs);
            inputs += member.size;
            offset = end;
        }
        inputs_before.push(inputs);
        let mut layout = Layout {
            members,
            spans,
            inputs_before,
            zip64,
            directory_offset: offset,
            directory_len: 0,
            len: 0,
        };
        let directory: u64 = (0..layout.members.len()).map(|i| layout.central_len(i)).sum();
        layout.directory_len = directory;
        let end_len = if layout.needs_zip64_end() { 56 + 20 + 22 } else { 22 };
        layout.len = offset + directory + end_len;
        Ok(layout)
    }

    /// The members, in order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The archive's size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the archive has no entries (it still has an end record).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The inputs' bytes in all.
    pub fn input_total(&self) -> u64 {
        self.inputs_before[self.members.len()]
    }

    /// What lies at archive byte `pos`.
    pub fn locate(&self, pos: u64) -> Region {
        if pos >= self.len {
            return Region::End;
        }
        if pos >= self.directory_offset {
            return Region::Directory { at: pos - self.directory_offset };
        }
        // The last entry whose header starts at or before `pos`.
        let entry = self.spans.partition_point(|s| s.header_offset <= pos) - 1;
        let span = &self.spans[entry];
        if pos < span.data_start {
            Region::Header { entry, at: pos - span.header_offset }
        } else if pos < span.data_end {
            Region::Data { entry, at: pos - span.data_start }
        } else {
            Region::Descriptor { entry, at: pos - span.data_end }
        }
    }

    /// Input bytes before archive byte `pos` (what progress counts).
    pub fn inputs_done(&self, pos: u64) -> u64 {
        match self.locate(pos) {
            Region::Header { entry, .. } => self.inputs_before[entry],
            Region::Data { entry, at } => self.inputs_before[entry] + at,
            Region::Descriptor { entry, .. } => self.inputs_before[entry + 1],
            Region::Directory { .. } | Region::End => self.input_total(),
        }
    }

    /// Entry `i`'s local file header.
    pub fn local_header(&self, i: usize) -> Vec<u8> {
        let (member, span) = (&self.members[i], &self.spans[i]);
        let mut out = Vec::with_capacity(50 + member.name.len());
        put32(&mut out, LOCAL_HEADER);
        put16(&mut out, if span.zip64 { NEEDED_45 } else { NEEDED_20 });
        put16(&mut out, FLAGS);
        put16(&mut out, 0); // stored
        put16(&mut out, DOS_TIME);
        put16(&mut out, DOS_DATE);
        put32(&mut out, 0); // CRC: in the descriptor
        // Sizes: in the descriptor; 0xFFFFFFFF says "ZIP64: see the extra field and an 8-byte
        // descriptor" (as Java's and Info-ZIP's streaming writers do).
        let size = if span.zip64 { u32::MAX } else { 0 };
        put32(&mut out, size);
        put32(&mut out, size);
        put16(&mut out, member.name.len() as u16);
        put16(&mut out, if span.zip64 { 20 } else { 0 });
        out.extend_from_slice(member.name.as_bytes());
        if span.zip64 {
            put16(&mut out, ZIP64_EXTRA);
            put16(&mut out, 16);
            put64(&mut out, 0);
            put64(&mut out, 0);
        }
        out
    }

    /// Entry `i`'s data descriptor, with its data's CRC-32.
    pub fn descriptor(&self, i: usize, crc: u32) -> Vec<u8> {
        let (size, zip64) = (self.members[i].size, self.spans[i].zip64);
        let mut out = Vec::with_capacity(24);
        put32(&mut out, DATA_DESCRIPTOR);
        put32(&mut out, crc);
        if zip64 {
            put64(&mut out, size);
            put64(&mut out, size);
        } else {
            put32(&mut out, size as u32);
            put32(&mut out, size as u32);
        }
        out
    }

    /// Whether entry `i`'s central record puts its local header offset in the ZIP64 field.
    fn offset_zip64(&self, i: usize) -> bool {
        self.zip64 == Zip64::Always || self.spans[i].header_offset >= MAX_32
    }

    /// The ZIP64 extra field's length in entry `i`'s central record (0: none).
    fn central_extra_len(&self, i: usize) -> u64 {
        let fields = if self.spans[i].zip64 { 2 } else { 0 } + u64::from(self.offset_zip64(i));
        if fields == 0 { 0 } else { 4 + 8 * fields }
    }

    fn central_len(&self, i: usize) -> u64 {
        46 + self.members[i].name.len() as u64 + self.central_extra_len(i)
    }

    fn needs_zip64_end(&self) -> bool {
        self.zip64 == Zip64::Always
            || self.members.len() as u64 >= MAX_16
            || self.directory_len >= MAX_32
            || self.directory_offset >= MAX_32
    }

    /// The central directory and the end records, given every entry's CRC-32.
    pub fn directory(&self, crcs: &[u32]) -> Vec<u8> {
        assert_eq!(crcs.len(), self.members.len(), "a CRC per entry");
        let mut out = Vec::with_capacity((self.len - self.directory_offset) as usize);
        for (i, (member, span)) in self.members.iter().zip(&self.spans).enumerate() {
            put32(&mut out, CENTRAL_HEADER);
            put16(&mut out, MADE_BY);
            put16(&mut out, if span.zip64 || self.offset_zip64(i) { NEEDED_45 } else { NEEDED_20 });
            put16(&mut out, FLAGS);
            put16(&mut out, 0);
            put16(&mut out, DOS_TIME);
            put16(&mut out, DOS_DATE);
            put32(&mut out, crcs[i]);
            let size = if span.zip64 { u32::MAX } else { member.size as u32 };
            put32(&mut out, size);
            put32(&mut out, size);
            put16(&mut out, member.name.len() as u16);
            put16(&mut out, self.central_extra_len(i) as u16);
            put16(&mut out, 0); // comment
            put16(&mut out, 0); // disk number start
            put16(&mut out, 0); // internal attributes
            put32(&mut out, EXTERNAL_ATTRIBUTES);
            let offset_zip64 = self.offset_zip64(i);
            put32(&mut out, if offset_zip64 { u32::MAX } else { span.header_offset as u32 });
            out.extend_from_slice(member.name.as_bytes());
            let extra = self.central_extra_len(i);
            if extra > 0 {
                // The fields present are exactly those whose 32-bit value is 0xFFFFFFFF, in
                // the order uncompressed size, compressed size, local header offset.
                put16(&mut out, ZIP64_EXTRA);
                put16(&mut out, (extra - 4) as u16);
                if span.zip64 {
                    put64(&mut out, member.size);
                    put64(&mut out, member.size);
                }
                if offset_zip64 {
                    put64(&mut out, span.header_offset);
                }
            }
        }
        let count = self.members.len() as u64;
        let zip64_end_offset = self.directory_offset + self.directory_len;
        if self.needs_zip64_end() {
            put32(&mut out, ZIP64_END);
            put64(&mut out, 44); // the record's size after this field
            put16(&mut out, MADE_BY);
            put16(&mut out, NEEDED_45);
            put32(&mut out, 0); // this disk
            put32(&mut out, 0); // the directory's disk
            put64(&mut out, count);
            put64(&mut out, count);
            put64(&mut out, self.directory_len);
            put64(&mut out, self.directory_offset);
            put32(&mut out, ZIP64_LOCATOR);
            put32(&mut out, 0);
            put64(&mut out, zip64_end_offset);
            put32(&mut out, 1); // disks in all
        }
        let always = self.zip64 == Zip64::Always;
        let fit16 = |v: u64| if always || v >= MAX_16 { u16::MAX } else { v as u16 };
        let fit32 = |v: u64| if always || v >= MAX_32 { u32::MAX } else { v as u32 };
        put32(&mut out, END);
        put16(&mut out, 0);
        put16(&mut out, 0);
        put16(&mut out, fit16(count));
        put16(&mut out, fit16(count));
        put32(&mut out, fit32(self.directory_len));
        put32(&mut out, fit32(self.directory_offset));
        put16(&mut out, 0); // comment
        debug_assert_eq!(out.len() as u64, self.len - self.directory_offset);
        out
    }
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Entry names for uploads' file names, in order: each made a safe single path segment
/// (separators and control characters become `_`, at most [`MAX_NAME_BYTES`]) and unique —
/// ignoring case, so that extracting on a case-insensitive file system loses nothing — by
/// appending ` (2)`, ` (3)`, … before the extension: `a.csv`, `a (2).csv`.
pub fn unique_names<'a>(filenames: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    let mut names = Vec::new();
    for filename in filenames {
        let base = safe_name(filename);
        let (stem, ext) = match base.rfind('.') {
            Some(dot) if dot > 0 => base.split_at(dot),
            _ => (base.as_str(), ""),
        };
        let mut name = base.clone();
        let mut n = 2u64;
        while !taken.insert(name.to_lowercase()) {
            let suffix = format!(" ({n}){ext}");
            name = format!("{}{suffix}", truncate(stem, MAX_NAME_BYTES - suffix.len().min(200)));
            n += 1;
        }
        names.push(name);
    }
    names
}

fn safe_name(filename: &str) -> String {
    let name: String = filename
        .chars()
        .map(|c| if c == '/' || c == '\\' || c.is_control() { '_' } else { c })
        .collect();
    let name = truncate(&name, MAX_NAME_BYTES).to_owned();
    if name.is_empty() || name == "." || name == ".." { "file".to_owned() } else { name }
}

/// `s`, cut to at most `max` bytes at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Where the writer stands: everything a resumed writer needs besides the layout. It always
/// describes a part boundary (the bytes before `written` are in uploaded parts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Archive bytes written.
    pub written: u64,
    /// The CRC-32 of each finished entry's data, in order.
    pub crcs: Vec<u32>,
    /// The running CRC-32 of the data written so far of the entry `written` is in (0 outside
    /// an entry's data).
    pub crc: u32,
}

/// What the archive needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// These framing bytes (push them; what does not fit the part is asked for again).
    Bytes(Vec<u8>),
    /// The bytes of entry `entry`'s input from `offset` on.
    Input { entry: usize, offset: u64 },
    /// Nothing: the archive is complete.
    Done,
}

/// Writes an archive in parts of `part_size` bytes, from a [`Position`].
pub struct Archiver {
    layout: Layout,
    part_size: usize,
    /// The position at the end of `buffer`.
    at: Position,
    /// The running CRC at the end of `buffer` (of the entry whose data it is in).
    hasher: crc32fast::Hasher,
    buffer: Vec<u8>,
}

impl Archiver {
    /// A writer continuing from `position` (a part boundary; `Position::default()` to start).
    pub fn resume(layout: Layout, part_size: usize, position: Position) -> Archiver {
        let hasher = match layout.locate(position.written) {
            Region::Data { at, .. } => crc32fast::Hasher::new_with_initial_len(position.crc, at),
            _ => crc32fast::Hasher::new(),
        };
        let part_size = part_size.max(1);
        Archiver { layout, part_size, at: position, hasher, buffer: Vec::new() }
    }

    /// The layout being written.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Archive bytes produced so far (uploaded or buffered).
    pub fn produced(&self) -> u64 {
        self.at.written
    }

    /// What the archive needs next, at the end of the buffer.
    pub fn next(&self) -> Next {
        match self.layout.locate(self.at.written) {
            Region::Header { entry, at } => {
                Next::Bytes(self.layout.local_header(entry)[at as usize..].to_vec())
            }
            Region::Data { entry, at } => Next::Input { entry, offset: at },
            Region::Descriptor { entry, at } => {
                let descriptor = self.layout.descriptor(entry, self.at.crcs[entry]);
                Next::Bytes(descriptor[at as usize..].to_vec())
            }
            Region::Directory { at } => {
                Next::Bytes(self.layout.directory(&self.at.crcs)[at as usize..].to_vec())
            }
            Region::End => Next::Done,
        }
    }

    /// Appends the start of `bytes`, framing bytes [`Archiver::next`] asked for
    /// ([`Next::Bytes`]), up to the end of the part. Answers how many were taken (0 when the
    /// part is full: take it first).
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let left = match self.layout.locate(self.at.written) {
            Region::Header { entry, .. } => self.layout.spans[entry].data_start,
            Region::Descriptor { entry, .. } => self.layout.spans[entry].end,
            Region::Directory { .. } => self.layout.len,
            Region::Data { .. } | Region::End => self.at.written,
        } - self.at.written;
        self.append(bytes, left)
    }

    /// Appends the start of `bytes`, bytes of entry `entry`'s input at the offset
    /// [`Archiver::next`] asked for ([`Next::Input`]), up to the end of the part and of the
    /// entry. Answers how many were taken: 0 when the part is full (take it first) or when the
    /// entry's data is complete (the input has more bytes than its size said).
    pub fn push_input(&mut self, entry: usize, bytes: &[u8]) -> usize {
        let left = match self.layout.locate(self.at.written) {
            Region::Data { entry: e, at } if e == entry => self.layout.members[entry].size - at,
            _ => 0,
        };
        let room = (self.part_size - self.buffer.len()) as u64;
        let take = &bytes[..(bytes.len() as u64).min(room).min(left) as usize];
        // Hashed before appending: appending the entry's last byte finalises its CRC.
        self.hasher.update(take);
        self.append(take, left)
    }

    fn append(&mut self, bytes: &[u8], region_left: u64) -> usize {
        let room = (self.part_size - self.buffer.len()) as u64;
        let n = (bytes.len() as u64).min(room).min(region_left) as usize;
        self.buffer.extend_from_slice(&bytes[..n]);
        self.at.written += n as u64;
        // Past an entry's data (or an empty entry's header): its CRC is final.
        if let Region::Descriptor { entry, .. } = self.layout.locate(self.at.written)
            && self.at.crcs.len() == entry
        {
            let hasher = std::mem::replace(&mut self.hasher, crc32fast::Hasher::new());
            self.at.crcs.push(hasher.finalize());
        }
        n
    }

    /// Whether the buffer holds a whole part.
    pub fn part_full(&self) -> bool {
        self.buffer.len() >= self.part_size
    }

    /// Whether the archive is complete (its last bytes may still be buffered).
    pub fn complete(&self) -> bool {
        self.at.written >= self.layout.len
    }

    /// Bytes buffered, not yet taken as a part.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Takes the buffered bytes as a part, with the position right after them (what to
    /// checkpoint once the part is uploaded).
    pub fn take_part(&mut self) -> (Vec<u8>, Position) {
        let left = self.layout.len.saturating_sub(self.at.written);
        let next = Vec::with_capacity(left.min(self.part_size as u64) as usize);
        let body = std::mem::replace(&mut self.buffer, next);
        self.at.crc = match self.layout.locate(self.at.written) {
            Region::Data { .. } => self.hasher.clone().finalize(),
            _ => 0,
        };
        (body, self.at.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::{Cursor, Read, Seek, SeekFrom};

    /// Inputs as (file name, bytes).
    type Files = Vec<(String, Vec<u8>)>;

    fn members(files: &Files) -> Vec<Member> {
        let names = unique_names(files.iter().map(|(name, _)| name.as_str()));
        names
            .into_iter()
            .zip(files)
            .map(|(name, (_, d))| Member { name, size: d.len() as u64 })
            .collect()
    }

    /// Writes the archive as the stage does: inputs read in `chunk`-byte chunks, parts of
    /// `part_size`; after each push in `crash_after` (counting pushes), the writer is dropped
    /// with its buffer and a new one resumes from the last part's position, read back from JSON.
    fn write(
        files: &Files,
        part_size: usize,
        chunk: usize,
        zip64: Zip64,
        crash_after: &[u32],
    ) -> Vec<u8> {
        let layout = Layout::new(members(files), zip64).unwrap();
        let mut out = Vec::new();
        let mut committed = Position::default();
        let mut archiver = Archiver::resume(layout.clone(), part_size, committed.clone());
        let mut pushes = 0u32;
        loop {
            if archiver.part_full() {
                let (part, position) = archiver.take_part();
                out.extend(part);
                assert_eq!(
                    out.len() as u64,
                    position.written,
                    "a part ends where its position says"
                );
                committed = position;
            }
            pushes += 1;
            if crash_after.contains(&pushes) {
                let json = serde_json::to_string(&committed).unwrap();
                archiver = Archiver::resume(
                    layout.clone(),
                    part_size,
                    serde_json::from_str(&json).unwrap(),
                );
                continue;
            }
            match archiver.next() {
                Next::Done => break,
                Next::Bytes(bytes) => {
                    archiver.push(&bytes);
                }
                Next::Input { entry, offset } => {
                    let data = &files[entry].1[offset as usize..];
                    let taken = archiver.push_input(entry, &data[..data.len().min(chunk)]);
                    assert!(taken > 0 || archiver.part_full());
                }
            }
        }
        let (part, position) = archiver.take_part();
        out.extend(part);
        assert_eq!(position.written, layout.len());
        assert_eq!(out.len() as u64, layout.len(), "the layout's length is the archive's");
        out
    }

    /// Reads `bytes` with the `zip` crate: (name, bytes) of each entry, checking each entry's
    /// CRC-32 as read.
    fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).expect("a readable archive");
        (0..archive.len())
            .map(|i| {
                let mut file = archive.by_index(i).unwrap();
                assert_eq!(file.compression(), zip::CompressionMethod::Stored);
                let mut body = Vec::new();
                // `zip` checks the CRC-32 at the end of the read: a wrong one is an error.
                file.read_to_end(&mut body).expect("the entry's CRC-32 matches");
                assert_eq!(file.crc32(), crc32fast::hash(&body));
                assert_eq!(file.size(), body.len() as u64);
                (file.name().unwrap().into_owned(), body)
            })
            .collect()
    }

    fn files() -> Files {
        vec![
            ("a.csv".into(), b"x,y\n1,2\n".to_vec()),
            ("empty.txt".into(), Vec::new()),
            ("A.CSV".into(), (0..=255u8).cycle().take(3000).collect()),
            ("a.csv".into(), b"again".to_vec()),
            ("r\u{e9}sum\u{e9} \u{1f600}.txt".into(), b"utf-8".to_vec()),
        ]
    }

    fn expected(files: &Files) -> Vec<(String, Vec<u8>)> {
        let names = unique_names(files.iter().map(|(n, _)| n.as_str()));
        names.into_iter().zip(files.iter().map(|(_, d)| d.clone())).collect()
    }

    #[test]
    fn a_real_reader_reads_back_names_bytes_and_crcs() {
        let files = files();
        for zip64 in [Zip64::Auto, Zip64::Always] {
            let bytes = write(&files, 7, 5, zip64, &[]);
            assert_eq!(unzip(&bytes), expected(&files), "{zip64:?}");
        }
        let names: Vec<String> = expected(&files).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["a.csv", "empty.txt", "A (2).CSV", "a (3).csv", "r\u{e9}sum\u{e9} \u{1f600}.txt"]
        );
    }

    #[test]
    fn zip64_records_are_written_only_where_needed_or_forced() {
        let files = files();
        let has = |bytes: &[u8], sig: u32| bytes.windows(4).any(|w| w == sig.to_le_bytes());
        let auto = write(&files, 1 << 20, 1 << 20, Zip64::Auto, &[]);
        let always = write(&files, 1 << 20, 1 << 20, Zip64::Always, &[]);
        assert!(!has(&auto, ZIP64_END) && !has(&auto, ZIP64_LOCATOR));
        assert!(has(&always, ZIP64_END) && has(&always, ZIP64_LOCATOR));
        // Forced, the classic end record says "see ZIP64" in every field.
        let end = &always[always.len() - 22..];
        assert_eq!(&end[..4], END.to_le_bytes());
        assert_eq!(&end[8..20], [0xFF; 12]);
        // Every local header has the ZIP64 extra field and 0xFFFFFFFF sizes; so does the
        // central directory; the reader takes sizes and offsets from them.
        let mut archive = zip::ZipArchive::new(Cursor::new(&always)).unwrap();
        let layout = Layout::new(members(&files), Zip64::Always).unwrap();
        for (i, span) in layout.spans.iter().enumerate() {
            let header = &always[span.header_offset as usize..span.data_start as usize];
            assert_eq!(&header[18..26], [0xFF; 8]);
            let file = archive.by_index(i).unwrap();
            assert_eq!(file.header_start(), span.header_offset);
            assert_eq!(file.data_start(), Some(span.data_start));
        }
    }

    #[test]
    fn names_are_unique_ignoring_case_and_safe() {
        let names = unique_names([
            "a.csv",
            "a.csv",
            "a (2).csv",
            "A.csv",
            "noext",
            "noext",
            ".hidden",
            ".hidden",
            "x/y\\z\n",
            "",
            "..",
        ]);
        assert_eq!(
            names,
            [
                "a.csv",
                "a (2).csv",
                "a (2) (2).csv",
                "A (3).csv",
                "noext",
                "noext (2)",
                ".hidden",
                ".hidden (2)",
                "x_y_z_",
                "file",
                "file (2)"
            ]
        );
        let long = "\u{e9}".repeat(200); // 400 bytes
        for name in unique_names([long.as_str(), long.as_str()]) {
            assert!(name.len() <= MAX_NAME_BYTES, "{}", name.len());
        }
    }

    /// An archive laid out by `layout` without its data in memory: the framing as written,
    /// zeros for the entries listed in `zeros`, the given bytes for the others.
    struct Sparse {
        layout: Layout,
        framing: Vec<(u64, Vec<u8>)>,
        data: Vec<Option<Vec<u8>>>,
        pos: u64,
    }

    impl Sparse {
        fn new(layout: Layout, data: Vec<Option<Vec<u8>>>) -> Sparse {
            let crcs: Vec<u32> = layout
                .members
                .iter()
                .zip(&data)
                .map(|(m, d)| match d {
                    Some(d) => crc32fast::hash(d),
                    None => zeros_crc(m.size),
                })
                .collect();
            let mut framing = Vec::new();
            for (i, span) in layout.spans.iter().enumerate() {
                framing.push((span.header_offset, layout.local_header(i)));
                framing.push((span.data_end, layout.descriptor(i, crcs[i])));
            }
            framing.push((layout.directory_offset, layout.directory(&crcs)));
            Sparse { layout, framing, data, pos: 0 }
        }
    }

    /// The CRC-32 of `n` zero bytes, by combining CRCs of doubling runs (5 GiB in a moment).
    fn zeros_crc(mut n: u64) -> u32 {
        let mut total = crc32fast::Hasher::new();
        let mut run = crc32fast::Hasher::new();
        run.update(&[0]);
        while n > 0 {
            if n & 1 == 1 {
                total.combine(&run);
            }
            let copy = run.clone();
            run.combine(&copy);
            n >>= 1;
        }
        total.finalize()
    }

    impl Read for Sparse {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = match self.layout.locate(self.pos) {
                Region::End => 0,
                Region::Data { entry, at } => {
                    let left = self.layout.members[entry].size - at;
                    let n = (buf.len() as u64).min(left) as usize;
                    match &self.data[entry] {
                        Some(d) => buf[..n].copy_from_slice(&d[at as usize..at as usize + n]),
                        None => buf[..n].fill(0),
                    }
                    n
                }
                _ => {
                    let (start, bytes) =
                        self.framing.iter().rev().find(|(start, _)| *start <= self.pos).unwrap();
                    let from = (self.pos - start) as usize;
                    let n = buf.len().min(bytes.len() - from);
                    buf[..n].copy_from_slice(&bytes[from..from + n]);
                    n
                }
            };
            self.pos += n as u64;
            Ok(n)
        }
    }

    impl Seek for Sparse {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.pos = match to {
                SeekFrom::Start(p) => p,
                SeekFrom::End(d) => self.layout.len.checked_add_signed(d).unwrap(),
                SeekFrom::Current(d) => self.pos.checked_add_signed(d).unwrap(),
            };
            Ok(self.pos)
        }
    }

    #[test]
    fn an_archive_past_4_gib_uses_zip64_where_needed_and_reads_back() {
        const BIG: u64 = 5 << 30;
        let members = vec![
            Member { name: "small-before.txt".into(), size: 5 },
            Member { name: "big.bin".into(), size: BIG },
            Member { name: "after.txt".into(), size: 11 },
        ];
        let layout = Layout::new(members, Zip64::Auto).unwrap();
        assert!(!layout.spans[0].zip64 && layout.spans[1].zip64 && !layout.spans[2].zip64);
        assert!(!layout.offset_zip64(1) && layout.offset_zip64(2));
        assert!(layout.needs_zip64_end(), "the directory starts past 4 GiB");
        let data = vec![Some(b"hello".to_vec()), None, Some(b"hello world".to_vec())];
        let mut archive = zip::ZipArchive::new(Sparse::new(layout.clone(), data)).unwrap();
        assert_eq!(archive.len(), 3);
        let big = archive.by_index_raw(1).unwrap();
        assert_eq!(
            (&*big.name().unwrap(), big.size(), big.crc32()),
            ("big.bin", BIG, zeros_crc(BIG))
        );
        drop(big);
        let mut after = archive.by_index(2).unwrap();
        assert_eq!(after.header_start(), layout.spans[2].header_offset);
        assert!(after.header_start() > u64::from(u32::MAX));
        let mut body = String::new();
        after.read_to_string(&mut body).unwrap();
        assert_eq!((&*after.name().unwrap(), body.as_str()), ("after.txt", "hello world"));
        drop(after);
        let mut first = archive.by_index(0).unwrap();
        let mut body = String::new();
        first.read_to_string(&mut body).unwrap();
        assert_eq!(body, "hello");
    }

    #[test]
    fn more_than_65535_entries_use_the_zip64_end_record() {
        let files: Files = (0..70_000).map(|i| (format!("f{i}"), vec![(i % 251) as u8])).collect();
        let bytes = write(&files, 1 << 20, 64, Zip64::Auto, &[]);
        let end = &bytes[bytes.len() - 22..];
        assert_eq!(&end[8..12], [0xFF; 4], "the classic record's counts say \"see ZIP64\"");
        let archive = zip::ZipArchive::new(Cursor::new(&bytes)).unwrap();
        assert_eq!(archive.len(), 70_000);
        let mut archive = archive;
        let mut last = archive.by_index(69_999).unwrap();
        let mut body = Vec::new();
        last.read_to_end(&mut body).unwrap();
        assert_eq!((&*last.name().unwrap(), body), ("f69999", vec![(69_999 % 251) as u8]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any entry sizes, part size, chunk size and crashes (each drops the buffered bytes
        /// and resumes from the last part's position): the same archive, read back whole.
        #[test]
        fn resumed_at_any_part_boundary_the_archive_is_the_same(
            sizes in proptest::collection::vec(0usize..300, 1..6),
            part_size in 1usize..96,
            chunk in 1usize..64,
            crashes in proptest::collection::vec(1u32..400, 0..8),
            always in any::<bool>(),
        ) {
            let files: Files = sizes.iter().enumerate()
                .map(|(i, &n)| (format!("f{}.bin", i % 3), (0..n).map(|b| (b * 7 + i) as u8).collect()))
                .collect();
            let zip64 = if always { Zip64::Always } else { Zip64::Auto };
            let straight = write(&files, part_size, chunk, zip64, &[]);
            prop_assert_eq!(&write(&files, part_size, chunk, zip64, &crashes), &straight);
            prop_assert_eq!(unzip(&straight), expected(&files));
        }
    }
}
