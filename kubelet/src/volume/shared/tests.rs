use super::*;
use crate::volume::subpath::Binder;
use crate::volume::subpath::fake::FakeBinder;
use std::sync::Arc;

const PRIVATE: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
42 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw
";

#[test]
fn the_mount_holding_the_path_decides() {
    assert!(!is_shared(PRIVATE, Path::new("/var/lib/kubelet")));
    assert!(is_shared(PRIVATE, Path::new("/run/netns/x")));
    // After the bind onto itself: the longest containing mount point counts.
    let bound = format!(
        "{PRIVATE}90 27 254:0 /var/lib/kubelet /var/lib/kubelet rw shared:7 - ext4 /dev/vda rw\n"
    );
    assert!(is_shared(&bound, Path::new("/var/lib/kubelet")));
    assert!(is_shared(&bound, Path::new("/var/lib/kubelet/pods/u")));
    assert!(!is_shared(&bound, Path::new("/var/lib/kubelet-other")));
    // A "shared:" after the separator is the superblock's, not propagation.
    let odd = "27 1 254:0 / / rw - ext4 shared:9 rw\n";
    assert!(!is_shared(odd, Path::new("/x")));
    // Escaped mount points.
    let spaced = "27 1 254:0 / / rw - ext4 /dev/vda rw\n91 27 254:0 / /srv/a\\040b rw shared:3 - ext4 /dev/vda rw\n";
    assert!(is_shared(spaced, Path::new("/srv/a b/c")));
}

#[tokio::test]
async fn the_root_dir_is_made_rshared_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeBinder::default());
    let root = dir.path().join("kubelet");
    let f = fake.clone();
    make_root_dir_rshared(move |d| f.make_rshared(d), root.clone()).await;
    assert!(root.is_dir());
    assert_eq!(*fake.shared.lock().unwrap(), vec![root]);
}
