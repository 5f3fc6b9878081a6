//! The fake's `ImageService`: pulls add images, the rest reads and removes them.

use tonic::{Request, Response, Status};

use super::Svc;
use crate::v1 as pb;

type Answer<T> = Result<Response<T>, Status>;

/// Size of a pulled image.
const PULLED_SIZE: u64 = 1 << 20;

#[tonic::async_trait]
impl crate::ImageService for Svc {
    async fn list_images(
        &self,
        req: Request<pb::ListImagesRequest>,
    ) -> Answer<pb::ListImagesResponse> {
        let r = self.enter("ListImages", req).await?;
        let st = self.state();
        let want = r
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        let images = match want {
            Some(reference) => st.find_image(&reference).cloned().into_iter().collect(),
            None => st.images.values().cloned().collect(),
        };
        Ok(Response::new(pb::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        req: Request<pb::ImageStatusRequest>,
    ) -> Answer<pb::ImageStatusResponse> {
        let r = self.enter("ImageStatus", req).await?;
        let reference = r.image.map(|i| i.image).unwrap_or_default();
        // An image the runtime does not have is no error: the answer has no image.
        Ok(Response::new(pb::ImageStatusResponse {
            image: self.state().find_image(&reference).cloned(),
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        req: Request<pb::PullImageRequest>,
    ) -> Answer<pb::PullImageResponse> {
        let r = self.enter("PullImage", req).await?;
        let reference = r.image.map(|i| i.image).unwrap_or_default();
        if reference.is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        let id = self.state().add_image(&reference, PULLED_SIZE);
        Ok(Response::new(pb::PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        req: Request<pb::RemoveImageRequest>,
    ) -> Answer<pb::RemoveImageResponse> {
        let r = self.enter("RemoveImage", req).await?;
        let reference = r.image.map(|i| i.image).unwrap_or_default();
        let mut st = self.state();
        if let Some(id) = st.find_image(&reference).map(|i| i.id.clone()) {
            st.images.remove(&id);
        }
        Ok(Response::new(pb::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        req: Request<pb::ImageFsInfoRequest>,
    ) -> Answer<pb::ImageFsInfoResponse> {
        self.enter("ImageFsInfo", req).await?;
        let st = self.state();
        let used: u64 = st.images.values().map(|i| i.size).sum();
        let fs = |mountpoint: &str, used: u64| pb::FilesystemUsage {
            timestamp: st.next as i64,
            fs_id: Some(pb::FilesystemIdentifier {
                mountpoint: mountpoint.into(),
            }),
            used_bytes: Some(pb::UInt64Value { value: used }),
            inodes_used: Some(pb::UInt64Value {
                value: st.images.len() as u64,
            }),
        };
        Ok(Response::new(pb::ImageFsInfoResponse {
            image_filesystems: vec![fs("/var/lib/fake-cri/images", used)],
            container_filesystems: vec![fs("/var/lib/fake-cri/rootfs", 0)],
        }))
    }
}
