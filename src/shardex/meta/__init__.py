"""The cluster-state model: the coordinator's ``StateContext``, the member list, index
definitions and states, rebalance records and the partitioning function.

Plain data and pure functions shared by the data, index, scan and client packages; the
manager package runs the coordinator that changes it.
"""
