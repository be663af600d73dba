//! Where a lock lives, in terms that survive SWAPDB.

/// Where a lock lives: a database *identity* (stable across SWAPDB) and the
/// key name. Timers and waiters remember a `Place`, never a raw db index.
/// One allocation (the identity's 4 bytes, then the name): every held lock
/// has one in the deadline wheel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Place(Box<[u8]>);

impl Place {
    pub fn new(ident: u32, key: &[u8]) -> Self {
        Place([&ident.to_le_bytes()[..], key].concat().into_boxed_slice())
    }

    pub fn ident(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    pub fn key(&self) -> &[u8] {
        &self.0[4..]
    }
}

/// SWAPDB exchanges two databases' contents; remembered places follow the
/// contents, so each identity maps to the db index it is at now.
#[derive(Default)]
pub struct DbMap {
    ident_to_db: Vec<i32>,
    db_to_ident: Vec<u32>,
}

impl DbMap {
    fn grow(&mut self, n: usize) {
        while self.db_to_ident.len() < n {
            let i = self.db_to_ident.len();
            self.db_to_ident.push(i as u32);
            self.ident_to_db.push(i as i32);
        }
    }

    pub fn ident(&mut self, db: i32) -> u32 {
        let db = db.max(0) as usize;
        self.grow(db + 1);
        self.db_to_ident[db]
    }

    pub fn db(&self, ident: u32) -> i32 {
        self.ident_to_db.get(ident as usize).copied().unwrap_or(ident as i32)
    }

    pub fn swap(&mut self, a: i32, b: i32) {
        let (ia, ib) = (self.ident(a), self.ident(b));
        self.db_to_ident.swap(a as usize, b as usize);
        self.ident_to_db[ia as usize] = b;
        self.ident_to_db[ib as usize] = a;
    }
}
