"""Process-level utilities every service uses: thread names, reconcile loops, atomic file
writes, pausing the cyclic collector. Nothing here knows a service."""
