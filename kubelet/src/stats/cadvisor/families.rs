//! The families `/metrics/cadvisor` serves: name, type and cAdvisor's help text.

const C: &str = "counter";
const G: &str = "gauge";

/// Every family served: name, type, cAdvisor's help text.
pub(super) const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "container_cpu_cfs_periods_total",
        C,
        "Number of elapsed enforcement period intervals.",
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        C,
        "Number of throttled period intervals.",
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        C,
        "Total time duration the container has been throttled.",
    ),
    (
        "container_cpu_usage_seconds_total",
        C,
        "Cumulative cpu time consumed in seconds.",
    ),
    ("container_fs_inodes_free", G, "Number of available Inodes"),
    ("container_fs_inodes_total", G, "Number of Inodes"),
    (
        "container_fs_limit_bytes",
        G,
        "Number of bytes that can be consumed by the container on this filesystem.",
    ),
    (
        "container_fs_reads_bytes_total",
        C,
        "Cumulative count of bytes read",
    ),
    (
        "container_fs_reads_total",
        C,
        "Cumulative count of reads completed",
    ),
    (
        "container_fs_usage_bytes",
        G,
        "Number of bytes that are consumed by the container on this filesystem.",
    ),
    (
        "container_fs_writes_bytes_total",
        C,
        "Cumulative count of bytes written",
    ),
    (
        "container_fs_writes_total",
        C,
        "Cumulative count of writes completed",
    ),
    (
        "container_memory_cache",
        G,
        "Number of bytes of page cache memory.",
    ),
    (
        "container_memory_failcnt",
        C,
        "Number of memory usage hits limits",
    ),
    (
        "container_memory_mapped_file",
        G,
        "Size of memory mapped files in bytes.",
    ),
    (
        "container_memory_max_usage_bytes",
        G,
        "Maximum memory usage recorded in bytes",
    ),
    ("container_memory_rss", G, "Size of RSS in bytes."),
    ("container_memory_swap", G, "Container swap usage in bytes."),
    (
        "container_memory_usage_bytes",
        G,
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
    ),
    (
        "container_memory_working_set_bytes",
        G,
        "Current working set in bytes.",
    ),
    (
        "container_network_receive_bytes_total",
        C,
        "Cumulative count of bytes received",
    ),
    (
        "container_network_receive_errors_total",
        C,
        "Cumulative count of errors encountered while receiving",
    ),
    (
        "container_network_receive_packets_dropped_total",
        C,
        "Cumulative count of packets dropped while receiving",
    ),
    (
        "container_network_receive_packets_total",
        C,
        "Cumulative count of packets received",
    ),
    (
        "container_network_transmit_bytes_total",
        C,
        "Cumulative count of bytes transmitted",
    ),
    (
        "container_network_transmit_errors_total",
        C,
        "Cumulative count of errors encountered while transmitting",
    ),
    (
        "container_network_transmit_packets_dropped_total",
        C,
        "Cumulative count of packets dropped while transmitting",
    ),
    (
        "container_network_transmit_packets_total",
        C,
        "Cumulative count of packets transmitted",
    ),
    (
        "container_oom_events_total",
        C,
        "Count of out of memory events observed for the container",
    ),
    (
        "container_pressure_cpu_stalled_seconds_total",
        C,
        "Total time duration no tasks in the container could make progress due to CPU congestion.",
    ),
    (
        "container_pressure_cpu_waiting_seconds_total",
        C,
        "Total time duration tasks in the container have waited due to CPU congestion.",
    ),
    (
        "container_pressure_io_stalled_seconds_total",
        C,
        "Total time duration no tasks in the container could make progress due to IO congestion.",
    ),
    (
        "container_pressure_io_waiting_seconds_total",
        C,
        "Total time duration tasks in the container have waited due to IO congestion.",
    ),
    (
        "container_pressure_memory_stalled_seconds_total",
        C,
        "Total time duration no tasks in the container could make progress due to memory congestion.",
    ),
    (
        "container_pressure_memory_waiting_seconds_total",
        C,
        "Total time duration tasks in the container have waited due to memory congestion.",
    ),
    (
        "container_scrape_error",
        G,
        "1 if there was an error while getting container metrics, 0 otherwise",
    ),
    (
        "container_spec_cpu_period",
        G,
        "CPU period of the container.",
    ),
    ("container_spec_cpu_quota", G, "CPU quota of the container."),
    (
        "container_spec_cpu_shares",
        G,
        "CPU share of the container.",
    ),
    (
        "container_spec_memory_limit_bytes",
        G,
        "Memory limit for the container.",
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        G,
        "Memory reservation limit for the container.",
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        G,
        "Memory swap limit for the container.",
    ),
    (
        "container_start_time_seconds",
        G,
        "Start time of the container since unix epoch in seconds.",
    ),
    ("machine_cpu_cores", G, "Number of logical CPU cores."),
    (
        "machine_cpu_physical_cores",
        G,
        "Number of physical CPU cores.",
    ),
    ("machine_cpu_sockets", G, "Number of CPU sockets."),
    (
        "machine_memory_bytes",
        G,
        "Amount of memory installed on the machine.",
    ),
    (
        "machine_scrape_error",
        G,
        "1 if there was an error while getting machine metrics, 0 otherwise.",
    ),
    (
        "machine_swap_bytes",
        G,
        "Amount of swap memory available on the machine.",
    ),
    (
        "container_last_seen",
        G,
        "Last time a container was seen by the exporter",
    ),
    (
        "container_health_state",
        G,
        "The result of the container's health check",
    ),
    (
        "container_cpu_user_seconds_total",
        C,
        "Cumulative user cpu time consumed in seconds.",
    ),
    (
        "container_cpu_system_seconds_total",
        C,
        "Cumulative system cpu time consumed in seconds.",
    ),
    (
        "container_cpu_cfs_burst_periods_total",
        C,
        "Number of periods when burst occurs.",
    ),
    (
        "container_cpu_cfs_burst_seconds_total",
        C,
        "Total time duration the container has been bursted.",
    ),
    (
        "container_cpu_load_average_10s",
        G,
        "Value of container cpu load average over the last 10 seconds.",
    ),
    (
        "container_cpu_load_d_average_10s",
        G,
        "Value of container cpu load.d average over the last 10 seconds.",
    ),
    ("container_tasks_state", G, "Number of tasks in given state"),
    (
        "container_memory_kernel_usage",
        G,
        "Size of kernel memory allocated in bytes.",
    ),
    (
        "container_memory_total_active_file_bytes",
        G,
        "Current total active file in bytes.",
    ),
    (
        "container_memory_total_inactive_file_bytes",
        G,
        "Current total inactive file in bytes.",
    ),
    (
        "container_memory_failures_total",
        C,
        "Cumulative count of memory allocation failures.",
    ),
    (
        "container_processes",
        G,
        "Number of processes running inside the container.",
    ),
    (
        "container_file_descriptors",
        G,
        "Number of open file descriptors for the container.",
    ),
    (
        "container_sockets",
        G,
        "Number of open sockets for the container.",
    ),
    (
        "container_threads_max",
        G,
        "Maximum number of threads allowed inside the container, infinity if value is zero",
    ),
    (
        "container_threads",
        G,
        "Number of threads running inside the container",
    ),
    (
        "container_ulimits_soft",
        G,
        "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
    ),
];
