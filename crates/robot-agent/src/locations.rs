//! Named locations (`agent.location.*`), kept in a local JSON file.
//!
//! Every change is written (atomically) before it is acknowledged, so an
//! acknowledged location survives a crash or a power cut.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use signalling_protocol::Location;

use crate::fsutil;

/// Default cap on stored locations; beyond it `LOCATION_STORAGE_FULL`.
pub const DEFAULT_MAX_LOCATIONS: usize = 1000;
/// Longest accepted location name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("location {0:?} does not exist")]
    NotFound(String),
    #[error("location {0:?} already exists")]
    AlreadyExists(String),
    #[error("invalid location name: {0}")]
    NameInvalid(String),
    #[error("location storage is full ({0} locations)")]
    StorageFull(usize),
    #[error("cannot store locations in {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Serialize, Deserialize)]
struct FileFormat {
    version: u32,
    locations: Vec<Location>,
}

/// The robot's saved locations, in creation order.
#[derive(Debug)]
pub struct LocationStore {
    path: Option<PathBuf>,
    locations: Vec<Location>,
    max: usize,
}

impl LocationStore {
    /// A store that is never written (tests, or `--ephemeral` use).
    pub fn in_memory(max: usize) -> LocationStore {
        LocationStore {
            path: None,
            locations: Vec::new(),
            max,
        }
    }

    /// Opens the file at `path`, creating nothing until the first change.
    ///
    /// A file that cannot be parsed is moved aside (never deleted) and the
    /// store starts empty: the robot must still come up, and the operator
    /// can recover the old file by hand.
    pub fn open(path: &Path, max: usize) -> Result<LocationStore, LocationError> {
        let mut store = LocationStore {
            path: Some(path.to_owned()),
            locations: Vec::new(),
            max,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(store),
            Err(source) => {
                return Err(LocationError::Storage {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        match serde_json::from_str::<FileFormat>(&text) {
            Ok(file) => store.locations = file.locations,
            Err(e) => {
                let aside = path.with_extension(format!(
                    "corrupt-{}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0)
                ));
                tracing::error!(path = %path.display(), moved_to = %aside.display(), error = %e,
                    "locations file is unreadable; starting with no locations");
                std::fs::rename(path, &aside).map_err(|source| LocationError::Storage {
                    path: path.to_owned(),
                    source,
                })?;
            }
        }
        Ok(store)
    }

    pub fn list(&self) -> Vec<Location> {
        self.locations.clone()
    }

    pub fn get(&self, name: &str) -> Option<&Location> {
        self.locations.iter().find(|l| l.name == name)
    }

    pub fn create(&mut self, location: Location) -> Result<(), LocationError> {
        check_name(&location.name)?;
        if self.get(&location.name).is_some() {
            return Err(LocationError::AlreadyExists(location.name));
        }
        if self.locations.len() >= self.max {
            return Err(LocationError::StorageFull(self.max));
        }
        self.locations.push(location);
        if let Err(e) = self.persist() {
            self.locations.pop();
            return Err(e);
        }
        Ok(())
    }

    /// Overwrites the location of the same name (all fields, per the spec).
    pub fn update(&mut self, location: Location) -> Result<(), LocationError> {
        check_name(&location.name)?;
        let index = self
            .locations
            .iter()
            .position(|l| l.name == location.name)
            .ok_or_else(|| LocationError::NotFound(location.name.clone()))?;
        let old = std::mem::replace(&mut self.locations[index], location);
        if let Err(e) = self.persist() {
            self.locations[index] = old;
            return Err(e);
        }
        Ok(())
    }

    pub fn delete(&mut self, name: &str) -> Result<(), LocationError> {
        let index = self
            .locations
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| LocationError::NotFound(name.to_owned()))?;
        let old = self.locations.remove(index);
        if let Err(e) = self.persist() {
            self.locations.insert(index, old);
            return Err(e);
        }
        Ok(())
    }

    fn persist(&self) -> Result<(), LocationError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let file = FileFormat {
            version: 1,
            locations: self.locations.clone(),
        };
        let text = serde_json::to_string_pretty(&file).unwrap_or_default();
        fsutil::write_atomic(path, text.as_bytes()).map_err(|source| LocationError::Storage {
            path: path.clone(),
            source,
        })
    }
}

/// Names are shown in operator UIs and used as keys: printable text only,
/// no surrounding whitespace, bounded length.
pub fn check_name(name: &str) -> Result<(), LocationError> {
    let invalid = |why: &str| Err(LocationError::NameInvalid(why.to_owned()));
    if name.is_empty() {
        return invalid("must not be empty");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return invalid("must be at most 128 characters");
    }
    if name.trim() != name {
        return invalid("must not start or end with whitespace");
    }
    if name.chars().any(char::is_control) {
        return invalid("must not contain control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use signalling_protocol::Position;

    fn loc(name: &str, x: f64) -> Location {
        Location {
            name: name.into(),
            position: Position { x, y: 1.0, z: None },
            orientation: None,
            metadata: None,
        }
    }

    #[test]
    fn crud_round_trip_survives_restart() {
        let dir = crate::testutil::temp_dir("locations");
        let path = dir.join("locations.json");
        let mut store = LocationStore::open(&path, 10).expect("open");
        store.create(loc("dock", 1.0)).expect("create");
        store.create(loc("desk", 2.0)).expect("create");
        store.update(loc("dock", 5.0)).expect("update");
        store.delete("desk").expect("delete");

        let reopened = LocationStore::open(&path, 10).expect("reopen");
        assert_eq!(reopened.list(), vec![loc("dock", 5.0)]);
    }

    #[test]
    fn errors_map_to_the_spec_cases() {
        let mut store = LocationStore::in_memory(1);
        store.create(loc("a", 0.0)).expect("create");
        assert!(matches!(
            store.create(loc("a", 1.0)),
            Err(LocationError::AlreadyExists(_))
        ));
        assert!(matches!(
            store.create(loc("b", 1.0)),
            Err(LocationError::StorageFull(1))
        ));
        assert!(matches!(
            store.update(loc("zzz", 1.0)),
            Err(LocationError::NotFound(_))
        ));
        assert!(matches!(
            store.delete("zzz"),
            Err(LocationError::NotFound(_))
        ));
        for bad in ["", " a", "a ", "a\nb", &"x".repeat(129)] {
            assert!(
                matches!(check_name(bad), Err(LocationError::NameInvalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unreadable_file_is_moved_aside() {
        let dir = crate::testutil::temp_dir("locations-bad");
        let path = dir.join("locations.json");
        std::fs::write(&path, "not json").expect("write");
        let store = LocationStore::open(&path, 10).expect("open");
        assert!(store.list().is_empty());
        let moved = std::fs::read_dir(&dir)
            .expect("list")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains("corrupt-"));
        assert!(moved);
    }
}
