//! The bundled offline world: a seeded generator of people, cities, countries and companies with
//! attributes and relations, rendered as a document corpus, and task families with golden answers
//! and the solution the oracle follows.
//!
//! Everything follows from `(seed, size)`, so the shipped `examples/world` files can be checked
//! against a regeneration and scaled up by flags.

use std::collections::{BTreeMap, HashSet};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How big a world to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldConfig {
    /// The seed of every random choice.
    pub seed: u64,
    /// Countries; cities, people and companies scale with it (3, 6 and 2 per country).
    pub countries: usize,
    /// Tasks per family (multi-objective tasks: per objective count 2..=10).
    pub tasks_per_family: usize,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig { seed: 7, countries: 6, tasks_per_family: 12 }
    }
}

/// A kind of entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    /// Born in a city in a given year, with an occupation and an employer.
    Person,
    /// In a country, with a founding year and a population: people's birthplaces and companies'
    /// headquarters.
    City,
    /// Has a capital and a currency: where multi-hop lookups from a person or company end.
    Country,
    /// Has an industry, a founding year, a founder and headquarters in a city.
    Company,
}

impl EntityKind {
    /// The kind as a noun: `person`, `city`, `country`, `company`.
    pub fn noun(self) -> &'static str {
        match self {
            EntityKind::Person => "person",
            EntityKind::City => "city",
            EntityKind::Country => "country",
            EntityKind::Company => "company",
        }
    }
}

/// One entity: a name, a kind and its facts (attribute or relation name to value; a relation's
/// value is another entity's name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entity {
    /// Unique across the world: the title of its document and the value relations point at.
    pub name: String,
    /// Which facts it has and how questions about it are worded.
    pub kind: EntityKind,
    /// Attribute or relation name to value, written into its document as sentences.
    pub facts: BTreeMap<String, Value>,
}

impl Entity {
    fn fact(&self, key: &str) -> &Value {
        self.facts.get(key).unwrap_or(&Value::Null)
    }

    fn text(&self, key: &str) -> String {
        match self.fact(key) {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }

    /// The entity rendered as a short encyclopedia article.
    pub fn document(&self) -> Document {
        let n = &self.name;
        let f = |k: &str| self.text(k);
        let text = match self.kind {
            EntityKind::Person => format!(
                "{n} is {} born in the city of {} in {}. {n} works for {}.",
                with_article(&f("occupation")),
                f("born_in"),
                f("birth_year"),
                f("works_for")
            ),
            EntityKind::City => format!(
                "{n} is a city in {}. It was founded in {} and has a population of {}.",
                f("country"),
                f("founded"),
                f("population")
            ),
            EntityKind::Country => {
                format!("{n} is a country whose capital is {}. Its currency is the {}.", f("capital"), f("currency"))
            }
            EntityKind::Company => format!(
                "{n} is {} company headquartered in {}. It was founded in {} by {}.",
                with_article(&f("industry")),
                f("headquarters"),
                f("founded"),
                f("founder")
            ),
        };
        Document { title: n.clone(), text }
    }
}

/// One document of the corpus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// The article's title (the entity's name).
    pub title: String,
    /// The article's sentences, which the search tool indexes.
    pub text: String,
}

/// A task family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// One lookup.
    SingleHop,
    /// 2-4 lookups, each needing the previous answer.
    MultiHopSequential,
    /// 2-4 lookups with independent branches (comparisons, "same country?").
    MultiHopParallel,
    /// 2-10 independent questions in one task (MemPO's setting).
    MultiObjective,
    /// Lookups followed by arithmetic a Python tool does exactly.
    Numeric,
    /// A user's task with no known family.
    Custom,
}

impl Family {
    /// Every family the world generates tasks for, in generation order (`Custom` is not one).
    pub const GENERATED: [Family; 5] = [
        Family::SingleHop,
        Family::MultiHopSequential,
        Family::MultiHopParallel,
        Family::MultiObjective,
        Family::Numeric,
    ];

    /// The snake_case name evaluation reports label the family's row with.
    pub fn name(self) -> &'static str {
        match self {
            Family::SingleHop => "single_hop",
            Family::MultiHopSequential => "multi_hop_sequential",
            Family::MultiHopParallel => "multi_hop_parallel",
            Family::MultiObjective => "multi_objective",
            Family::Numeric => "numeric",
            Family::Custom => "custom",
        }
    }
}

/// One step of a solution: a search call and the fact it establishes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The step's id (`"1"`, `"2"`, ...), which later steps' dependencies name.
    pub id: String,
    /// What the step finds, in words known when the plan is written (the plan's task text): a
    /// step that depends on another refers to that step's result, not to its value.
    pub description: String,
    /// The same once the dependencies' results are known, naming the entity searched for.
    #[serde(default)]
    pub action: String,
    /// What the oracle's search call asks the corpus.
    pub query: String,
    /// Ids of steps whose findings the query needs.
    pub depends_on: Vec<String>,
    /// The fact the step establishes, in words.
    pub finding: String,
    /// The value later steps and the answer are built from.
    pub value: String,
}

/// Exact arithmetic over findings, done by an agent-written Python tool in SEARL's style.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compute {
    /// The name the tool is created under.
    pub name: String,
    /// The tool's description, as `create_and_execute_mcp` receives it (and the plan's task text).
    pub description: String,
    /// Python source of a function called `name`.
    pub code: String,
    /// The arguments the created tool is run on, built from the steps' values.
    pub inputs: Value,
}

/// How the task is solved: steps (a dependency graph) and optional arithmetic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// The search steps, each naming the steps whose findings it needs.
    pub steps: Vec<Step>,
    /// Arithmetic after the lookups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<Compute>,
}

/// A task: a question, its accepted answers and, for generated tasks, the solution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Unique within a task set.
    #[serde(default)]
    pub id: String,
    /// The family.
    #[serde(default = "custom")]
    pub family: Family,
    /// The question the agent is asked, as written.
    pub question: String,
    /// Accepted answers (a multi-objective task has one, the sub-answers joined by "; ").
    pub golden_answers: Vec<String>,
    /// Number of questions in the task.
    #[serde(default = "one")]
    pub objectives: usize,
    /// The oracle's solution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solution: Option<Solution>,
}

fn custom() -> Family {
    Family::Custom
}

fn one() -> usize {
    1
}

/// A generated world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct World {
    /// The seed and sizes that generated it, so the same world can be made again.
    pub config: WorldConfig,
    /// Every entity, by kind then name.
    pub entities: Vec<Entity>,
}

const SYLLABLES: [&str; 40] = [
    "ka", "lo", "mer", "vin", "ta", "sor", "el", "dra", "pen", "qui", "ros", "ba", "thal", "ne", "cor", "vy", "zan",
    "mi", "gor", "lu", "fen", "ari", "dor", "sel", "kai", "bru", "mon", "tev", "ola", "rin", "hask", "pel", "yor",
    "dun", "isa", "ver", "nol", "gad", "umb", "wex",
];
const OCCUPATIONS: [&str; 10] = [
    "chemist",
    "painter",
    "architect",
    "violinist",
    "surgeon",
    "novelist",
    "astronomer",
    "engineer",
    "botanist",
    "judge",
];
const INDUSTRIES: [&str; 8] =
    ["shipbuilding", "textile", "software", "mining", "brewing", "publishing", "railway", "pharmaceutical"];
const CURRENCIES: [&str; 8] = ["crown", "mark", "florin", "ducat", "thaler", "real", "dinar", "guilder"];
const COMPANY_SUFFIXES: [&str; 5] = ["Works", "Holdings", "Industries", "Company", "Group"];

struct Names {
    rng: StdRng,
    used: HashSet<String>,
}

impl Names {
    fn word(&mut self, syllables: usize) -> String {
        let mut w: String = (0..syllables).map(|_| *SYLLABLES.choose(&mut self.rng).unwrap_or(&"ka")).collect();
        if let Some(first) = w.get(0..1) {
            w = first.to_uppercase() + &w[1..];
        }
        w
    }

    fn fresh(&mut self, make: impl Fn(&mut Self) -> String) -> String {
        loop {
            let name = make(self);
            if self.used.insert(name.to_lowercase()) {
                return name;
            }
        }
    }
}

impl World {
    /// Most countries a world may have: the name syllables give about 1,600 distinct city names.
    pub const MAX_COUNTRIES: usize = 400;

    /// Generates the world for `config` (countries clamped to 2..=[`World::MAX_COUNTRIES`]).
    pub fn generate(config: WorldConfig) -> World {
        let mut names = Names { rng: StdRng::seed_from_u64(config.seed), used: HashSet::new() };
        let nc = config.countries.clamp(2, World::MAX_COUNTRIES);
        let countries: Vec<String> = (0..nc).map(|_| names.fresh(|n| n.word(3))).collect();
        let cities: Vec<String> = (0..nc * 3).map(|_| names.fresh(|n| n.word(2))).collect();
        let people: Vec<String> = (0..nc * 6)
            .map(|_| {
                names.fresh(|n| {
                    let given = n.word(2);
                    let family = n.word(2);
                    format!("{given} {family}")
                })
            })
            .collect();
        let companies: Vec<String> = (0..nc * 2)
            .map(|_| {
                names.fresh(|n| {
                    let suffix = *COMPANY_SUFFIXES.choose(&mut n.rng).unwrap_or(&"Works");
                    format!("{} {suffix}", n.word(2))
                })
            })
            .collect();
        let rng = &mut names.rng;
        let mut entities = Vec::new();
        for (i, c) in countries.iter().enumerate() {
            entities.push(Entity {
                name: c.clone(),
                kind: EntityKind::Country,
                facts: BTreeMap::from([
                    ("capital".into(), json!(cities[i * 3])),
                    ("currency".into(), json!(CURRENCIES[i % CURRENCIES.len()])),
                ]),
            });
        }
        let mut populations = HashSet::new();
        for (i, c) in cities.iter().enumerate() {
            // Distinct populations and years keep comparisons unambiguous.
            let population = loop {
                let p = rng.random_range(20..4000) * 1000 + rng.random_range(0..1000);
                if populations.insert(p) {
                    break p;
                }
            };
            entities.push(Entity {
                name: c.clone(),
                kind: EntityKind::City,
                facts: BTreeMap::from([
                    ("country".into(), json!(countries[i / 3])),
                    ("founded".into(), json!(800 + i * 53 % 1100)),
                    ("population".into(), json!(population)),
                ]),
            });
        }
        // Distinct years keep "who was born earliest" unambiguous at any size.
        let mut years: Vec<i64> = (1900..1900 + people.len().max(100) as i64).collect();
        years.shuffle(rng);
        for (i, p) in people.iter().enumerate() {
            entities.push(Entity {
                name: p.clone(),
                kind: EntityKind::Person,
                facts: BTreeMap::from([
                    ("born_in".into(), json!(cities.choose(rng).unwrap_or(&cities[0]))),
                    ("birth_year".into(), json!(years[i % years.len()])),
                    ("occupation".into(), json!(OCCUPATIONS.choose(rng).unwrap_or(&"judge"))),
                    ("works_for".into(), json!(companies[i % companies.len()])),
                ]),
            });
        }
        let mut founded: Vec<i64> = (1850..1850 + companies.len().max(170) as i64).collect();
        founded.shuffle(rng);
        for (i, c) in companies.iter().enumerate() {
            entities.push(Entity {
                name: c.clone(),
                kind: EntityKind::Company,
                facts: BTreeMap::from([
                    ("industry".into(), json!(INDUSTRIES.choose(rng).unwrap_or(&"mining"))),
                    ("headquarters".into(), json!(cities.choose(rng).unwrap_or(&cities[0]))),
                    ("founded".into(), json!(founded[i % founded.len()])),
                    ("founder".into(), json!(people.choose(rng).unwrap_or(&people[0]))),
                ]),
            });
        }
        World { config, entities }
    }

    /// Looks an entity up by name, to follow a relation to the entity it names.
    pub fn entity(&self, name: &str) -> Option<&Entity> {
        self.entities.iter().find(|e| e.name == name)
    }

    fn of_kind(&self, kind: EntityKind) -> Vec<&Entity> {
        self.entities.iter().filter(|e| e.kind == kind).collect()
    }

    /// The corpus: one document per entity.
    pub fn documents(&self) -> Vec<Document> {
        self.entities.iter().map(Entity::document).collect()
    }

    /// Every family's tasks, in a fixed order.
    pub fn tasks(&self) -> Vec<Task> {
        self.tasks_worded(Wording::Templates, &BTreeMap::new())
    }

    /// The same tasks (entities, answers, solutions) asked in other words: sentence frames the
    /// generator never writes, so no training trace has seen them. Held-out EM on these tells
    /// whether a policy learned the task or the templates.
    pub fn reworded_tasks(&self) -> Vec<Task> {
        self.tasks_worded(Wording::Reworded, &BTreeMap::new())
    }

    /// Every family's tasks, with `counts` tasks of the families it names instead of the
    /// world's own count: a training mixture weighted towards some families. Families are drawn in
    /// the order of [`Family::GENERATED`] from one random stream, so a family's tasks start as the
    /// plain [`World::tasks`] do (numeric, the last family, keeps its first ones and gains more);
    /// a family after an overridden one gets other tasks.
    pub fn tasks_counted(&self, counts: &BTreeMap<Family, usize>) -> Vec<Task> {
        self.tasks_worded(Wording::Templates, counts)
    }

    fn tasks_worded(&self, w: Wording, counts: &BTreeMap<Family, usize>) -> Vec<Task> {
        let mut rng = StdRng::seed_from_u64(self.config.seed ^ 0x7a5c);
        let n = self.config.tasks_per_family;
        let mut tasks = Vec::new();
        for family in Family::GENERATED {
            let count = match counts.get(&family) {
                Some(&c) => c,
                None if family == Family::MultiObjective => 9 * n.div_ceil(3),
                None => n,
            };
            for i in 0..count {
                let mut task = match family {
                    Family::SingleHop => self.single_hop(&mut rng, w),
                    Family::MultiHopSequential => self.sequential(&mut rng, 2 + i % 3, w),
                    Family::MultiHopParallel => self.parallel(&mut rng, i, w),
                    Family::MultiObjective => self.multi_objective(&mut rng, 2 + i % 9, w),
                    Family::Numeric => self.numeric(&mut rng, i, w),
                    Family::Custom => continue,
                };
                task.id = format!("{}-{i:03}", family.name());
                tasks.push(task);
            }
        }
        tasks
    }

    fn pick(&self, rng: &mut StdRng, kind: EntityKind) -> &Entity {
        let all = self.of_kind(kind);
        all[rng.random_range(0..all.len())]
    }

    fn lookup(&self, id: usize, entity: &Entity, key: &str, depends_on: Vec<String>) -> (Step, String) {
        let value = entity.text(key);
        let n = &entity.name;
        // A step that depends on another cannot name its entity yet: the plan is written before
        // the earlier step's search, so it refers to that step's result instead.
        let subject = match depends_on.first() {
            Some(d) => format!("the {} from task {d}", entity.kind.noun()),
            None => n.clone(),
        };
        let describe = |s: &str| match key {
            "born_in" => format!("the city where {s} was born"),
            "birth_year" => format!("the year {s} was born"),
            "founded" => format!("the year {s} was founded"),
            "founder" => format!("who founded {s}"),
            "country" => format!("the country {s} is in"),
            "works_for" => format!("the company {s} works for"),
            other => format!("the {} of {s}", other.replace('_', " ")),
        };
        let fact = match key {
            "born_in" | "birth_year" => format!("{n} was born in {value}"),
            "founded" => format!("{n} was founded in {value}"),
            "founder" => format!("{n} was founded by {value}"),
            "country" => format!("{n} is in {value}"),
            "works_for" => format!("{n} works for {value}"),
            other => format!("the {} of {n} is {value}", other.replace('_', " ")),
        };
        let step = Step {
            id: id.to_string(),
            description: format!("Find {}", describe(&subject)),
            action: format!("Find {}", describe(n)),
            query: entity.name.clone(),
            depends_on,
            finding: fact,
            value: value.clone(),
        };
        (step, value)
    }

    fn single_hop(&self, rng: &mut StdRng, w: Wording) -> Task {
        let (question, entity, key) = self.simple_question(rng, w);
        let (step, answer) = self.lookup(1, entity, key, vec![]);
        task(Family::SingleHop, question, answer, vec![step], None)
    }

    fn simple_question(&self, rng: &mut StdRng, w: Wording) -> (String, &Entity, &'static str) {
        let kind =
            [EntityKind::Person, EntityKind::City, EntityKind::Company, EntityKind::Country][rng.random_range(0..4)];
        let e = self.pick(rng, kind);
        let n = &e.name;
        let key = match (kind, rng.random_range(0..2)) {
            (EntityKind::Person, 0) => "born_in",
            (EntityKind::Person, _) => "occupation",
            (EntityKind::City, 0) => "population",
            (EntityKind::City, _) => "country",
            (EntityKind::Company, 0) => "founder",
            (EntityKind::Company, _) => "founded",
            (EntityKind::Country, _) => "capital",
        };
        let q = match (w, key) {
            (Wording::Templates, "born_in") => format!("In which city was {n} born?"),
            (Wording::Templates, "occupation") => format!("What is the occupation of {n}?"),
            (Wording::Templates, "population") => format!("What is the population of {n}?"),
            (Wording::Templates, "country") => format!("In which country is {n}?"),
            (Wording::Templates, "founder") => format!("Who founded {n}?"),
            (Wording::Templates, "founded") => format!("In what year was {n} founded?"),
            (Wording::Templates, _) => format!("What is the capital of {n}?"),
            (Wording::Reworded, "born_in") => format!("{n} was born in a city. Which one?"),
            (Wording::Reworded, "occupation") => format!("What does {n} do for a living?"),
            (Wording::Reworded, "population") => format!("How many people live in {n}?"),
            (Wording::Reworded, "country") => format!("{n} lies in which country?"),
            (Wording::Reworded, "founder") => format!("Name the person who set up {n}."),
            (Wording::Reworded, "founded") => format!("When was {n} established? Give the year."),
            (Wording::Reworded, _) => format!("Name the capital city of {n}."),
        };
        (q, e, key)
    }

    /// A chain of `hops` lookups: company -> founder -> birthplace -> country -> currency.
    fn sequential(&self, rng: &mut StdRng, hops: usize, w: Wording) -> Task {
        // (relation key, phrase for "the X of {}") from a company down to a currency.
        let chain: [(&str, &str); 4] = match w {
            Wording::Templates => [
                ("founder", "the founder of {}"),
                ("born_in", "the city where {} was born"),
                ("country", "the country that {} is in"),
                ("currency", "the currency of {}"),
            ],
            Wording::Reworded => [
                ("founder", "the person who set up {}"),
                ("born_in", "the birthplace of {}"),
                ("country", "the nation where {} lies"),
                ("currency", "the money used in {}"),
            ],
        };
        let start = 4 - hops;
        let kinds = [EntityKind::Company, EntityKind::Person, EntityKind::City, EntityKind::Country];
        let mut entity = self.pick(rng, kinds[start]);
        let mut phrase = entity.name.clone();
        let mut steps = Vec::new();
        let mut answer = String::new();
        for (i, (key, template)) in chain[start..].iter().enumerate() {
            let deps = if i == 0 { vec![] } else { vec![i.to_string()] };
            let (step, value) = self.lookup(i + 1, entity, key, deps);
            steps.push(step);
            phrase = template.replace("{}", &phrase);
            answer = value.clone();
            if let Some(next) = self.entity(&value) {
                entity = next;
            }
        }
        let question = match w {
            Wording::Templates => format!("What is {phrase}?"),
            Wording::Reworded => format!("Tell me {phrase}."),
        };
        task(Family::MultiHopSequential, question, answer, steps, None)
    }

    /// Independent branches: compare 2-4 entities, or ask whether two people share a country.
    fn parallel(&self, rng: &mut StdRng, i: usize, w: Wording) -> Task {
        if i % 4 == 3 {
            let a = self.pick(rng, EntityKind::Person);
            let b = loop {
                let b = self.pick(rng, EntityKind::Person);
                if b.name != a.name {
                    break b;
                }
            };
            let (s1, city_a) = self.lookup(1, a, "born_in", vec![]);
            let (s2, city_b) = self.lookup(2, b, "born_in", vec![]);
            let ca = self.entity(&city_a).map_or(a, |e| e);
            let cb = self.entity(&city_b).map_or(b, |e| e);
            let (s3, country_a) = self.lookup(3, ca, "country", vec!["1".into()]);
            let (s4, country_b) = self.lookup(4, cb, "country", vec!["2".into()]);
            let answer = if country_a == country_b { "yes" } else { "no" };
            let question = match w {
                Wording::Templates => format!("Were {} and {} born in the same country?", a.name, b.name),
                Wording::Reworded => format!("Do {} and {} come from one country? Say yes or no.", a.name, b.name),
            };
            return task(Family::MultiHopParallel, question, answer.into(), vec![s1, s2, s3, s4], None);
        }
        let k = 2 + i % 3;
        let (kind, key, question_start, pick_max) = match i % 3 {
            0 => (EntityKind::City, "population", "Which city has the largest population", true),
            1 => (EntityKind::Company, "founded", "Which company was founded first", false),
            _ => (EntityKind::Person, "birth_year", "Who was born earliest", false),
        };
        let chosen = self.distinct(rng, kind, k);
        let mut steps = Vec::new();
        let mut best: Option<(i64, &str)> = None;
        for (j, e) in chosen.iter().enumerate() {
            let (step, value) = self.lookup(j + 1, e, key, vec![]);
            steps.push(step);
            let v = value.parse::<i64>().unwrap_or_default();
            let better = best.is_none_or(|(b, _)| if pick_max { v > b } else { v < b });
            if better {
                best = Some((v, e.name.as_str()));
            }
        }
        let names: Vec<&str> = chosen.iter().map(|e| e.name.as_str()).collect();
        let question = match (w, i % 3) {
            (Wording::Templates, _) => format!("{question_start}: {}?", join_or(&names)),
            (Wording::Reworded, 0) => format!("Among {}, which city is home to the most people?", join_and(&names)),
            (Wording::Reworded, 1) => format!("Among {}, which company is the oldest?", join_and(&names)),
            (Wording::Reworded, _) => format!("Among {}, who is the oldest person?", join_and(&names)),
        };
        let answer = best.map(|(_, n)| n.to_string()).unwrap_or_default();
        task(Family::MultiHopParallel, question, answer, steps, None)
    }

    fn distinct(&self, rng: &mut StdRng, kind: EntityKind, k: usize) -> Vec<&Entity> {
        let mut all = self.of_kind(kind);
        all.shuffle(rng);
        all.truncate(k);
        all
    }

    fn multi_objective(&self, rng: &mut StdRng, objectives: usize, w: Wording) -> Task {
        let mut questions = Vec::new();
        let mut answers = Vec::new();
        let mut steps = Vec::new();
        let mut seen = HashSet::new();
        while questions.len() < objectives {
            let (q, e, key) = self.simple_question(rng, w);
            if !seen.insert(q.clone()) {
                continue;
            }
            let (step, answer) = self.lookup(steps.len() + 1, e, key, vec![]);
            steps.push(step);
            questions.push(format!("({}) {q}", questions.len() + 1));
            answers.push(answer);
        }
        let question = match w {
            Wording::Templates => format!(
                "Answer each question and give the answers in order, separated by semicolons. {}",
                questions.join(" ")
            ),
            Wording::Reworded => format!(
                "Please reply to all of the following, keeping their order and putting a semicolon between \
                 the replies. {}",
                questions.join(" ")
            ),
        };
        let mut t = task(Family::MultiObjective, question, answers.join("; "), steps, None);
        t.objectives = objectives;
        t
    }

    /// Sums of populations or gaps between founding years: exact arithmetic over findings.
    fn numeric(&self, rng: &mut StdRng, i: usize, w: Wording) -> Task {
        let k = 2 + i % 3;
        let (kind, key, what) = if i.is_multiple_of(2) {
            (EntityKind::City, "population", "the total population")
        } else {
            (EntityKind::Company, "founded", "the sum of the founding years")
        };
        let chosen = self.distinct(rng, kind, k);
        let mut steps = Vec::new();
        let mut values = Vec::new();
        for (j, e) in chosen.iter().enumerate() {
            let (step, value) = self.lookup(j + 1, e, key, vec![]);
            steps.push(step);
            values.push(value.parse::<i64>().unwrap_or_default());
        }
        let names: Vec<&str> = chosen.iter().map(|e| e.name.as_str()).collect();
        let question = match (w, key) {
            (Wording::Templates, _) => format!("What is {what} of {}?", join_and(&names)),
            (Wording::Reworded, "population") => format!("Add up the populations of {}.", join_and(&names)),
            (Wording::Reworded, _) => format!("Add together the years in which {} were founded.", join_and(&names)),
        };
        let compute = Compute {
            name: "sum_integers".into(),
            description: "Add a list of integers exactly.".into(),
            code: "def sum_integers(values: list[int]) -> int:\n    return sum(values)\n".into(),
            inputs: json!({ "values": values }),
        };
        let answer = values.iter().sum::<i64>().to_string();
        task(Family::Numeric, question, answer, steps, Some(compute))
    }
}

/// How task questions are worded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wording {
    /// The generator's templates, which training traces use.
    Templates,
    /// Other sentence frames, never used in training.
    Reworded,
}

fn with_article(word: &str) -> String {
    let article = if word.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    format!("{article} {word}")
}

fn task(family: Family, question: String, answer: String, steps: Vec<Step>, compute: Option<Compute>) -> Task {
    Task {
        id: String::new(),
        family,
        question,
        golden_answers: vec![answer],
        objectives: 1,
        solution: Some(Solution { steps, compute }),
    }
}

fn join_or(names: &[&str]) -> String {
    join_with(names, "or")
}

fn join_and(names: &[&str]) -> String {
    join_with(names, "and")
}

fn join_with(names: &[&str], word: &str) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} {word} {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_world_and_tasks() {
        let a = World::generate(WorldConfig::default());
        let b = World::generate(WorldConfig::default());
        assert_eq!(a, b);
        assert_eq!(a.tasks(), b.tasks());
        let c = World::generate(WorldConfig { seed: 8, ..WorldConfig::default() });
        assert_ne!(a.entities, c.entities);
    }

    #[test]
    fn a_family_count_adds_tasks_of_that_family_and_keeps_the_rest() {
        let world = World::generate(WorldConfig { seed: 3, countries: 4, tasks_per_family: 2 });
        let plain = world.tasks();
        let weighted = world.tasks_counted(&BTreeMap::from([(Family::Numeric, 6)]));
        let of = |tasks: &[Task], f: Family| tasks.iter().filter(|t| t.family == f).cloned().collect::<Vec<_>>();
        // Numeric is drawn last: every other family's tasks and the first numeric ones stay.
        for f in [Family::SingleHop, Family::MultiHopSequential, Family::MultiHopParallel, Family::MultiObjective] {
            assert_eq!(of(&plain, f), of(&weighted, f), "{f:?}");
        }
        let (numeric, more) = (of(&plain, Family::Numeric), of(&weighted, Family::Numeric));
        assert_eq!((numeric.len(), more.len()), (2, 6));
        assert_eq!(numeric[..], more[..2]);
        let ids: HashSet<&str> = weighted.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids.len(), weighted.len(), "task ids stay unique");
        let questions: HashSet<&str> = more.iter().map(|t| t.question.as_str()).collect();
        assert!(questions.len() >= 5, "the added tasks are new questions: {questions:?}");
        // Overriding a family to zero drops it; an empty map is the plain list.
        assert!(
            of(&world.tasks_counted(&BTreeMap::from([(Family::MultiObjective, 0)])), Family::MultiObjective).is_empty()
        );
        assert_eq!(world.tasks_counted(&BTreeMap::new()), plain);
    }

    #[test]
    fn every_task_is_answerable_from_its_steps() {
        let world = World::generate(WorldConfig::default());
        for task in world.tasks() {
            let solution = task.solution.as_ref().expect("generated tasks carry a solution");
            assert!(!solution.steps.is_empty(), "{}", task.id);
            for step in &solution.steps {
                assert!(world.entity(&step.query).is_some(), "{}: {}", task.id, step.query);
            }
            assert!(!task.golden_answers[0].is_empty(), "{}", task.id);
        }
        let families: HashSet<Family> = world.tasks().iter().map(|t| t.family).collect();
        assert_eq!(families.len(), Family::GENERATED.len());
    }
}
