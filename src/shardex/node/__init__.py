"""shardex.node"""
