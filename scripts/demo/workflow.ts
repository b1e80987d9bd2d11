import type { GateName } from '../../src/schemas/taskState.js';

export type Role = 'planner' | 'coder' | 'reviewer' | 'tester';

/** The demo workflow: each role takes tasks in one status to the next, flipping its gates. */
export const ROLES: Record<
  Role,
  {
    from: string;
    to: string;
    gates: Partial<Record<GateName, boolean>>;
    artifacts: (id: string) => Record<string, unknown>;
  }
> = {
  planner: {
    from: 'planning',
    to: 'implementing',
    gates: { plan_approved: true },
    artifacts: (id) => ({ implementation_plan: `s3://demo/plans/${id}.md` }),
  },
  coder: {
    from: 'implementing',
    to: 'reviewing',
    gates: { implementation_complete: true },
    artifacts: (id) => ({ code_files: [`src/${id}/index.ts`, `src/${id}/index.test.ts`] }),
  },
  reviewer: {
    from: 'reviewing',
    to: 'testing',
    gates: { review_passed: true, security_approved: true },
    artifacts: (id) => ({ review_report: `s3://demo/reviews/${id}.md` }),
  },
  tester: {
    from: 'testing',
    to: 'complete',
    gates: { tests_passing: true, deployment_approved: true },
    artifacts: (id) => ({ test_results: `s3://demo/tests/${id}.xml` }),
  },
};

export const WORKFLOW_DEFINITION = { name: 'cairn-demo', version: 1, stages: Object.keys(ROLES) };

export function topicOf(run: string, status: string): string {
  return `cairn.demo.${run}.${status}`;
}
