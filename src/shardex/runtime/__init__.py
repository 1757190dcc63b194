"""Process-level utilities every service uses: thread names, reconcile loops, atomic file
writes. Nothing here knows a service."""
