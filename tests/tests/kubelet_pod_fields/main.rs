//! Pod fields on real containerd (issue 27), one module per group of fields beside this file:
//! what the container sees from inside, or the refusal the pod gets where containerd 1.6
//! cannot provide the field.

mod mounts;
