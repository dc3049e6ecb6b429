"""Getting each message to one worker and back: the broker transport, sends, queues and priorities, routing.

Also who holds a message: leases and their reaper, claims on a video's stage, requeues, rebalancing.
"""
