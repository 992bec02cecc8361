//! A list of findings that may be long: counted, the first few kept in
//! memory for the text report, all of them (when asked) in an anonymous
//! temporary file of JSON lines for `--format json`. A million missing ids
//! cost disk, not memory.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// How many items the text report shows.
pub(crate) const SHOWN: usize = 20;

pub(crate) struct Listing<T> {
    count: u64,
    first: Vec<T>,
    /// Every item, when the report lists them all.
    all: Option<BufWriter<File>>,
    keep_all: bool,
}

impl<T: Serialize + DeserializeOwned> Listing<T> {
    /// `keep_all`: keep every item for [`Listing::for_each`], not only the
    /// first [`SHOWN`].
    pub(crate) fn new(keep_all: bool) -> Listing<T> {
        Listing {
            count: 0,
            first: Vec::new(),
            all: None,
            keep_all,
        }
    }

    pub(crate) fn push(&mut self, item: T) -> io::Result<()> {
        self.count += 1;
        if self.keep_all {
            if self.all.is_none() {
                self.all = Some(BufWriter::new(tempfile::tempfile()?));
            }
            if let Some(w) = &mut self.all {
                serde_json::to_writer(&mut *w, &item)?;
                w.write_all(b"\n")?;
            }
        }
        if self.first.len() < SHOWN {
            self.first.push(item);
        }
        Ok(())
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first [`SHOWN`] items.
    pub(crate) fn first(&self) -> &[T] {
        &self.first
    }

    /// Every item in the order pushed (only the first [`SHOWN`] unless
    /// made with `keep_all`).
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&T) -> io::Result<()>) -> io::Result<()> {
        let Some(w) = self.all.take() else {
            return self.first.iter().try_for_each(f);
        };
        let mut file = w.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        for line in BufReader::new(&file).lines() {
            let item: T = serde_json::from_str(&line?)?;
            f(&item)?;
        }
        file.seek(SeekFrom::End(0))?;
        self.all = Some(BufWriter::new(file));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_in_memory_and_all_on_disk_when_asked() {
        let mut short = Listing::new(false);
        let mut long = Listing::new(true);
        for i in 0..50u32 {
            short.push(format!("id-{i}")).unwrap();
            long.push(format!("id-{i}")).unwrap();
        }
        assert_eq!((short.count(), long.count()), (50, 50));
        assert_eq!(short.first().len(), SHOWN);
        assert_eq!(short.first()[19], "id-19");
        let collect = |l: &mut Listing<String>| {
            let mut v = Vec::new();
            l.for_each(|s| {
                v.push(s.clone());
                Ok(())
            })
            .unwrap();
            v
        };
        assert_eq!(collect(&mut short).len(), SHOWN);
        let all = collect(&mut long);
        assert_eq!(all.len(), 50);
        assert_eq!(all[49], "id-49");
        // Readable twice, and still appendable.
        long.push("id-50".into()).unwrap();
        assert_eq!(collect(&mut long).len(), 51);
    }
}
