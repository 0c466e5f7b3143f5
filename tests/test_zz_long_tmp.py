from hypothesis import settings, HealthCheck
from tests.test_group_machine import GroupMachine
GroupMachine.TestCase.settings = settings(max_examples=1500, stateful_step_count=50, deadline=None, suppress_health_check=list(HealthCheck))
TestLong = GroupMachine.TestCase
