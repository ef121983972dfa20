"""Privileged helpers of nvc-py and the framed protocol they speak over a socketpair.

Installed as ``nvc.rpc``: the parent plans, the forked helpers act with the least privilege.
"""
