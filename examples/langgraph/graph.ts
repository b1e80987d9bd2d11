/**
 * A LangGraph multi-agent graph, planner -> coder -> reviewer -> tester -> deploy, whose
 * record of the work is Cairn's: LangGraph's own checkpoints go to CairnSaver, and every node
 * moves the task's TaskState through compare-and-swap with its audit row and an outbox message
 * in the same transaction. The agents' model is a fake with fixed answers (no network, no key).
 */
import { FakeListChatModel } from '@langchain/core/utils/testing';
import { Annotation, END, START, StateGraph } from '@langchain/langgraph';
import type { BaseCheckpointSaver } from '@langchain/langgraph-checkpoint';
import type { LeaseManager, ReceiptStore, TaskStore } from '../../src/index.js';
import { type Deployment, deployStep } from './deploy.js';
import { type Agent, killPoint } from './killPoints.js';
import { commitStep } from './steps.js';

/**
 * What LangGraph keeps per step. Pointers and short answers only: no credentials, and no model
 * reasoning (the model's "Thinking:" part is dropped before anything is stored or sent).
 */
export const WorkflowState = Annotation.Root({
  taskId: Annotation<string>,
  /** The TaskState version the last node left: the next node's CAS expects it. */
  taskVersion: Annotation<number>,
  answers: Annotation<Partial<Record<Agent, string>>>({
    reducer: (a, b) => ({ ...a, ...b }),
    default: () => ({}),
  }),
  deployment: Annotation<Deployment | undefined>,
});
export type WorkflowStateT = typeof WorkflowState.State;

/** The fake model's fixed replies: reasoning, then the answer the node keeps. */
const REPLIES: Record<Exclude<Agent, 'deploy'>, string> = {
  planner:
    'Thinking: the request is a health endpoint; the router lives in src/http.ts.\n' +
    'Answer: add GET /healthz returning 200 and the build id; cover it with one test',
  coder:
    'Thinking: reuse the existing router, no new dependency.\n' +
    'Answer: healthz.ts and healthz.test.ts written (2 files)',
  reviewer:
    'Thinking: no input is read, nothing to escape; the build id is public.\n' +
    'Answer: approved, no security findings',
  tester: 'Thinking: run the unit tests of the changed files.\nAnswer: 2 passed, 0 failed',
};

/** The part of a reply after "Answer:"; a reply without one is refused rather than stored whole. */
export function answerOf(reply: unknown): string {
  const text = typeof reply === 'string' ? reply : JSON.stringify(reply);
  const at = text.indexOf('Answer:');
  if (at < 0) throw new Error('the model replied without an "Answer:" line; nothing of it is stored');
  return text.slice(at + 'Answer:'.length).trim();
}

export interface GraphDeps {
  store: TaskStore;
  receipts: ReceiptStore;
  leases: LeaseManager;
  checkpointer: BaseCheckpointSaver;
  /** The Kafka topic of the task's outbox messages. */
  topic: string;
  deployUrl: string;
  deployLeaseMs: number;
}

export function buildGraph(deps: GraphDeps) {
  const agent = (name: Exclude<Agent, 'deploy'>) => {
    const model = new FakeListChatModel({ responses: [REPLIES[name]] });
    return async (state: WorkflowStateT): Promise<Partial<WorkflowStateT>> => {
      killPoint(`${name}:start`);
      const reply = await model.invoke(
        `You are the ${name} of task ${state.taskId}. So far: ${JSON.stringify(state.answers)}`,
      );
      const answer = answerOf(reply.content);
      const version = await commitStep({
        store: deps.store,
        topic: deps.topic,
        agent: name,
        taskId: state.taskId,
        expectedVersion: state.taskVersion,
        summary: answer,
      });
      killPoint(`${name}:after-commit`);
      return { taskVersion: version, answers: { [name]: answer } };
    };
  };

  const deploy = async (state: WorkflowStateT): Promise<Partial<WorkflowStateT>> => {
    killPoint('deploy:start');
    const { version, deployment } = await deployStep({
      store: deps.store,
      receipts: deps.receipts,
      leases: deps.leases,
      topic: deps.topic,
      deployUrl: deps.deployUrl,
      leaseMs: deps.deployLeaseMs,
      taskId: state.taskId,
      expectedVersion: state.taskVersion,
    });
    killPoint('deploy:after-commit');
    return { taskVersion: version, deployment, answers: { deploy: 'deployed' } };
  };

  return new StateGraph(WorkflowState)
    .addNode('planner', agent('planner'))
    .addNode('coder', agent('coder'))
    .addNode('reviewer', agent('reviewer'))
    .addNode('tester', agent('tester'))
    .addNode('deploy', deploy)
    .addEdge(START, 'planner')
    .addEdge('planner', 'coder')
    .addEdge('coder', 'reviewer')
    .addEdge('reviewer', 'tester')
    .addEdge('tester', 'deploy')
    .addEdge('deploy', END)
    .compile({ checkpointer: deps.checkpointer });
}
