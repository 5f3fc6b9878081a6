//! systemd integration: readiness notification and the unit files that run the node agent.
