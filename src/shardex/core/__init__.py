"""Core types shared by every service: timestamps, topologies, values, key codec, expressions."""
