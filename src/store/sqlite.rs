//! The sqlite backend (stub).
pub struct SqliteStore;
impl SqliteStore {
    pub async fn open(_path: &std::path::Path) -> Result<Self, super::StoreError> {
        todo!()
    }
}
impl super::Backend for SqliteStore {
    async fn claim(
        &self,
        _: &super::ScopedKey,
        _: &str,
        _: std::time::Duration,
    ) -> Result<super::Claim, super::StoreError> {
        todo!()
    }
    async fn complete(
        &self,
        _: &super::ScopedKey,
        _: &super::LeaseToken,
        _: &super::Snapshot,
        _: std::time::Duration,
    ) -> Result<bool, super::StoreError> {
        todo!()
    }
    async fn release(
        &self,
        _: &super::ScopedKey,
        _: &super::LeaseToken,
    ) -> Result<bool, super::StoreError> {
        todo!()
    }
    async fn get(
        &self,
        _: &super::ScopedKey,
    ) -> Result<Option<super::KeyRecord>, super::StoreError> {
        todo!()
    }
    async fn forget(&self, _: &super::ScopedKey) -> Result<bool, super::StoreError> {
        todo!()
    }
    async fn ping(&self) -> Result<(), super::StoreError> {
        todo!()
    }
}
