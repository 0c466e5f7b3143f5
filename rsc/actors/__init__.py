"""trio actors, one per group and one per stream.

Inbox, group commit, journal and CAS snapshot, recovery and ticks, built on
`rsc.events` (arrives with the persistence issue).
"""
