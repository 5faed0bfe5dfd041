"""Floor 3, host: what servescope reads and does on the machine: processes, children, CPU priority, kernel stamps, host noise, HTTP."""
