"""Gangs: the device members of a distributed job are placed all together or not at all.

kube-scheduler places one pod at a time and tells an extender nothing about groups, so the
extender holds the whole picture: which pods form a gang (membership.py), who of them exists, is
bound and waits (book.py), and the plan that reserves every member at once or none (planner.py).
docs/GANGS.md says what it guarantees and what it cannot.
"""
