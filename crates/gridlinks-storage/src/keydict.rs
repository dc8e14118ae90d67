//! The key-name dictionary: every telemetry key name is interned to a small integer
//! once, so time-series rows carry a varint instead of the name.

use std::collections::HashMap;

use fjall::Keyspace;

use crate::codec::KeyId;
use crate::StoreError;

#[derive(Default)]
pub(crate) struct KeyDict {
    by_name: HashMap<String, KeyId>,
    by_id: Vec<String>,
}

impl KeyDict {
    /// Loads the dictionary persisted in the `keys` keyspace.
    pub fn load(ks: &Keyspace) -> Result<Self, StoreError> {
        let mut pairs = Vec::new();
        for kv in ks.iter() {
            let (name, id) = kv.into_inner()?;
            let id = <[u8; 4]>::try_from(&*id).map(u32::from_be_bytes).map_err(|_| StoreError::Corrupt("key id"))?;
            let name = String::from_utf8(name.to_vec()).map_err(|_| StoreError::Corrupt("key name utf-8"))?;
            pairs.push((id, name));
        }
        pairs.sort();
        let mut dict = Self::default();
        for (id, name) in pairs {
            if id as usize != dict.by_id.len() {
                return Err(StoreError::Corrupt("key ids not dense"));
            }
            dict.by_name.insert(name.clone(), id);
            dict.by_id.push(name);
        }
        Ok(dict)
    }

    pub fn id(&self, name: &str) -> Option<KeyId> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, id: KeyId) -> Option<&str> {
        self.by_id.get(id as usize).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Adds a new name; the caller persists (name → id) in the same commit.
    pub fn intern(&mut self, name: &str) -> KeyId {
        if let Some(id) = self.id(name) {
            return id;
        }
        let id = self.by_id.len() as KeyId;
        self.by_name.insert(name.to_owned(), id);
        self.by_id.push(name.to_owned());
        id
    }
}
