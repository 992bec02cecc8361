//! An external sort: entries are kept in memory up to a byte budget, each
//! full buffer is sorted and written to an anonymous temporary file (a
//! "run"), and the runs are merged back in order. What keeps the audit's
//! memory bounded whatever the range: a million ids never sit in a map.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

/// What the allocator adds to an entry's (two) heap allocations, about.
const ALLOCATION_OVERHEAD: usize = 32;

/// What a [`Sorter`] sorts: ordered, and written to and read from a run.
pub(crate) trait Entry: Ord + Sized {
    fn encode(&self, out: &mut impl Write) -> io::Result<()>;
    /// The next entry, `None` at the end of the run.
    fn decode(input: &mut impl Read) -> io::Result<Option<Self>>;
    /// Bytes the entry takes in memory, roughly (for the budget).
    fn heap_size(&self) -> usize;
}

/// Sorts any number of entries in about `budget` bytes of memory.
pub(crate) struct Sorter<T> {
    buffer: Vec<T>,
    bytes: usize,
    budget: usize,
    runs: Vec<File>,
    pushed: u64,
}

impl<T: Entry> Sorter<T> {
    pub(crate) fn new(budget: usize) -> Sorter<T> {
        Sorter {
            buffer: Vec::new(),
            bytes: 0,
            budget: budget.max(1),
            runs: Vec::new(),
            pushed: 0,
        }
    }

    pub(crate) fn push(&mut self, entry: T) -> io::Result<()> {
        // The entry in the buffer (which may have twice the room it uses),
        // and its heap parts with the allocator's overhead.
        self.bytes += entry.heap_size() + 2 * std::mem::size_of::<T>() + ALLOCATION_OVERHEAD;
        self.buffer.push(entry);
        self.pushed += 1;
        if self.bytes >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// Entries pushed so far.
    pub(crate) fn len(&self) -> u64 {
        self.pushed
    }

    /// Runs written to disk so far.
    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }

    fn spill(&mut self) -> io::Result<()> {
        self.buffer.sort_unstable();
        let mut file = BufWriter::new(tempfile::tempfile()?);
        for e in self.buffer.drain(..) {
            e.encode(&mut file)?;
        }
        let mut file = file.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        self.runs.push(file);
        self.bytes = 0;
        // Give the memory back: the next buffer grows again as needed.
        self.buffer = Vec::new();
        Ok(())
    }

    /// Every entry pushed, in order.
    pub(crate) fn finish(mut self) -> io::Result<Sorted<T>> {
        if self.runs.is_empty() {
            self.buffer.sort_unstable();
            return Ok(Sorted::Memory(self.buffer.into_iter()));
        }
        if !self.buffer.is_empty() {
            self.spill()?;
        }
        let mut readers: Vec<BufReader<File>> = self
            .runs
            .into_iter()
            .map(|f| BufReader::with_capacity(64 * 1024, f))
            .collect();
        let mut heap = BinaryHeap::with_capacity(readers.len());
        for (run, r) in readers.iter_mut().enumerate() {
            if let Some(entry) = T::decode(r)? {
                heap.push(Head { entry, run });
            }
        }
        Ok(Sorted::Merge { readers, heap })
    }
}

/// The smallest unread entry of one run.
pub(crate) struct Head<T> {
    entry: T,
    run: usize,
}

// A max-heap of reversed order is a min-heap.
impl<T: Ord> Ord for Head<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .entry
            .cmp(&self.entry)
            .then_with(|| other.run.cmp(&self.run))
    }
}

impl<T: Ord> PartialOrd for Head<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Ord> PartialEq for Head<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<T: Ord> Eq for Head<T> {}

/// The sorted entries: from memory, or merged from the runs.
pub(crate) enum Sorted<T> {
    Memory(std::vec::IntoIter<T>),
    Merge {
        readers: Vec<BufReader<File>>,
        heap: BinaryHeap<Head<T>>,
    },
}

impl<T: Entry> Iterator for Sorted<T> {
    type Item = io::Result<T>;

    fn next(&mut self) -> Option<io::Result<T>> {
        match self {
            Sorted::Memory(it) => it.next().map(Ok),
            Sorted::Merge { readers, heap } => {
                let Head { entry, run } = heap.pop()?;
                match T::decode(&mut readers[run]) {
                    Ok(Some(next)) => heap.push(Head { entry: next, run }),
                    Ok(None) => {}
                    Err(e) => return Some(Err(e)),
                }
                Some(Ok(entry))
            }
        }
    }
}

/// Length-prefixed bytes, for [`Entry::encode`].
pub(crate) fn write_bytes(out: &mut impl Write, b: &[u8]) -> io::Result<()> {
    out.write_all(&(b.len() as u32).to_le_bytes())?;
    out.write_all(b)
}

/// Bytes written by [`write_bytes`].
pub(crate) fn read_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let n = read_u32(input)? as usize;
    let mut b = vec![0; n];
    input.read_exact(&mut b)?;
    Ok(b)
}

/// An optional byte string: a flag byte, then [`write_bytes`].
pub(crate) fn write_opt_bytes(out: &mut impl Write, b: Option<&[u8]>) -> io::Result<()> {
    match b {
        None => out.write_all(&[0]),
        Some(b) => {
            out.write_all(&[1])?;
            write_bytes(out, b)
        }
    }
}

pub(crate) fn read_opt_bytes(input: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut flag = [0];
    input.read_exact(&mut flag)?;
    Ok(match flag[0] {
        0 => None,
        _ => Some(read_bytes(input)?),
    })
}

pub(crate) fn read_u32(input: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    input.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(crate) fn read_u64(input: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    input.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// The first length prefix of an entry, or `None` at a clean end of run.
pub(crate) fn read_first_u32(input: &mut impl Read) -> io::Result<Option<u32>> {
    let mut b = [0; 4];
    let mut got = 0;
    while got < 4 {
        match input.read(&mut b[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(Some(u32::from_le_bytes(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    struct E(Vec<u8>, u64);

    impl Entry for E {
        fn encode(&self, out: &mut impl Write) -> io::Result<()> {
            write_bytes(out, &self.0)?;
            out.write_all(&self.1.to_le_bytes())
        }
        fn decode(input: &mut impl Read) -> io::Result<Option<Self>> {
            let Some(n) = read_first_u32(input)? else {
                return Ok(None);
            };
            let mut b = vec![0; n as usize];
            input.read_exact(&mut b)?;
            Ok(Some(E(b, read_u64(input)?)))
        }
        fn heap_size(&self) -> usize {
            self.0.len()
        }
    }

    fn entries(n: u64) -> Vec<E> {
        // A fixed shuffle: multiplying by a number prime to n.
        (0..n)
            .map(|i| {
                let k = (i * 7919) % n;
                E(format!("id-{:05}", k % 500).into_bytes(), k)
            })
            .collect()
    }

    #[test]
    fn sorts_in_memory_and_across_runs_alike() {
        let input = entries(10_007);
        let mut want = input.clone();
        want.sort();
        for budget in [usize::MAX, 65_536, 4096] {
            let mut s = Sorter::new(budget);
            for e in input.iter().cloned() {
                s.push(e).unwrap();
            }
            assert_eq!(s.len(), 10_007);
            let spilled = s.runs() > 0;
            assert_eq!(spilled, budget != usize::MAX, "budget {budget}");
            let got: Vec<E> = s.finish().unwrap().map(Result::unwrap).collect();
            assert_eq!(got, want, "budget {budget}");
        }
    }

    #[test]
    fn an_empty_sorter_yields_nothing() {
        let s: Sorter<E> = Sorter::new(10);
        assert_eq!(s.finish().unwrap().count(), 0);
    }
}
